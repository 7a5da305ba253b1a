//! provm's exit status: the command's own, or one of provm's that says
//! what failed.

use std::process::ExitCode;

use provm::gdb::{DebugError, GdbError};
use provm_engine::replay::{ReplayError, ReplayReport};

/// provm's own failures exit with this status, so that they are not mistaken
/// for the command's (as `docker run` and `podman run` do).
const PROVM_FAILED: u8 = 125;
/// `provm replay` of a trace cut short that matched as far as it goes: not
/// the full check a complete trace gets, so not 0.
const REPLAY_CUT_SHORT: u8 = 3;
/// A tool observing a replay (an analysis, the debugger) failed: the
/// replay stopped without a verdict, which is neither a divergence (1) nor
/// provm failing to start (125).
const TOOL_FAILED: u8 = 4;

/// The exit status of a failure: `TOOL_FAILED` where a tool observing a
/// replay failed, else `PROVM_FAILED`.
pub fn failure_status(error: &(dyn std::error::Error + 'static)) -> u8 {
    let tool = matches!(
        error.downcast_ref::<ReplayError>(),
        Some(ReplayError::Analysis { .. })
    ) || matches!(
        error.downcast_ref::<GdbError>(),
        Some(GdbError::Debug(debug)) if !matches!(debug, DebugError::Replay(_))
    ) || error
        .downcast_ref::<provm::fork::ForkError>()
        .is_some_and(provm::fork::ForkError::is_tool_failure);
    if tool {
        TOOL_FAILED
    } else {
        PROVM_FAILED
    }
}

/// The exit code of a replay that ended with `report`.
pub fn verdict_status(report: &ReplayReport) -> ExitCode {
    match report {
        ReplayReport::Matched { .. } => ExitCode::SUCCESS,
        ReplayReport::CutShort { .. } => ExitCode::from(REPLAY_CUT_SHORT),
        ReplayReport::Diverged { .. } => ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An analysis or debugger failing is told apart from a divergence and
    /// from a trace that could not be replayed at all.
    #[test]
    fn tool_failures_have_their_own_exit_status() {
        let vm_error = || provm_vmm::vm::VmError::Stopped("observer".into());
        let analysis = ReplayError::Analysis {
            event: 7,
            error: vm_error(),
        };
        assert_eq!(failure_status(&analysis), TOOL_FAILED);
        let debugger = GdbError::Debug(DebugError::PastTheEnd {
            asked: 9,
            events: 7,
        });
        assert_eq!(failure_status(&debugger), TOOL_FAILED);
        let refused = GdbError::Debug(DebugError::Replay(ReplayError::NoWindowBreakpoints));
        assert_eq!(failure_status(&refused), PROVM_FAILED);
        assert_eq!(failure_status(&ReplayError::Vm(vm_error())), PROVM_FAILED);
        let fork_log = provm::fork::ForkError::Log {
            path: "fork.provm".into(),
            error: "No space left on device".into(),
        };
        assert_eq!(failure_status(&fork_log), TOOL_FAILED);
        let diverged = provm::fork::ForkError::Diverged("at event 7".into());
        assert_eq!(failure_status(&diverged), PROVM_FAILED);
    }
}
