//! The loops that drive a restored VM through the log, handing each debug
//! stop to an observer (gdb, the analyses).

use std::time::Instant;

use provm_vmm::guest_debug::DebugStop;
use provm_vmm::vm::{Vm, VmError, VmEvent};

use super::{Position, ReplayEnd, Replayer};

/// Why `Replayer::replay_observed` ended without a verdict.
#[derive(Debug, thiserror::Error)]
pub enum ObservedError {
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The observer failed at a debug stop; the replay had matched the log
    /// up to there.
    #[error("the replay's observer failed at log event {event}: {error} (the replay had matched up to there)")]
    Observer { event: u64, error: VmError },
}

/// What a replay does at a debug stop (see `Vm::set_guest_debug`); the
/// replay goes on when it returns. It may look at the guest and change the
/// breakpoints, but must not change the guest.
pub trait StopHandler {
    fn stopped(&mut self, vm: &mut Vm, stop: DebugStop, at: Position) -> Result<(), VmError>;
}

impl Replayer {
    /// Drives `vm`, restored from the trace's snapshot with this replayer
    /// as its seam, through the whole log.
    pub fn replay(&self, vm: &mut Vm, deadline: Instant) -> Result<ReplayEnd, VmError> {
        self.replay_observed(vm, deadline, &mut NoStops)
            .map_err(|error| match error {
                // NoStops never fails.
                ObservedError::Vm(error) | ObservedError::Observer { error, .. } => error,
            })
    }

    /// Like `replay`, handing each debug stop to `handler`. A handler's
    /// failure is the observer's, not the guest's: it ends the replay with
    /// an error, never a divergence.
    pub fn replay_observed(
        &self,
        vm: &mut Vm,
        deadline: Instant,
        handler: &mut dyn StopHandler,
    ) -> Result<ReplayEnd, ObservedError> {
        loop {
            match self.run_to_stop(vm, deadline)? {
                Stopped::Debug(stop) => {
                    let at = self.position();
                    handler
                        .stopped(vm, stop, at)
                        .map_err(|error| ObservedError::Observer {
                            event: at.events,
                            error,
                        })?;
                }
                Stopped::Paused => {}
                Stopped::Ended(end) => return Ok(end),
            }
        }
    }

    /// Drives `vm` until a debug stop, a pause (`pause_at`) or the end of
    /// the replay; call it again to go on.
    pub fn run_to_stop(&self, vm: &mut Vm, deadline: Instant) -> Result<Stopped, VmError> {
        loop {
            while let Some(bytes) = self.pending_agent_input() {
                vm.send_to_agent(&bytes);
            }
            match vm.run(deadline) {
                Ok(VmEvent::AgentOutput(_)) => continue,
                // Stopped to send the host's input where it was sent.
                Err(VmError::Stopped(_)) if self.pending_agent_input().is_some() => continue,
                Ok(VmEvent::DebugStop(stop)) => return Ok(Stopped::Debug(stop)),
                Ok(VmEvent::Paused) => return Ok(Stopped::Paused),
                stopped => return self.finish(stopped, vm.rip()).map(Stopped::Ended),
            }
        }
    }
}

/// Why `Replayer::run_to_stop` returned.
pub enum Stopped {
    /// A breakpoint or single step stopped the guest (see `StopHandler`).
    Debug(DebugStop),
    /// After the VM exit at which the log reached the event asked for with
    /// `Replayer::pause_at`: the VM can be snapshotted here.
    Paused,
    /// The replay is over.
    Ended(ReplayEnd),
}

/// Replays without stopping.
struct NoStops;

impl StopHandler for NoStops {
    fn stopped(&mut self, _: &mut Vm, _: DebugStop, _: Position) -> Result<(), VmError> {
        Ok(())
    }
}
