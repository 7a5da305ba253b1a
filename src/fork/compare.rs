//! How a fork's outcome differs from the recording's, and what that says
//! about the command: it handled the fault, crashed, or went on as if
//! nothing happened with different results.

use std::fmt;

use provm_guest_agent::Outcome as CommandOutcome;
use provm_trace::event_log::LogTotals;
use provm_trace::manifest::Outcome;

use super::log::LogSummary;
use crate::agent_outputs::{AgentOutputs, Quoted};

/// What one run (the recording, or the fork) produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunResult {
    /// As a shell reports it; `None` if the command did not finish.
    pub exit_status: Option<i32>,
    pub signaled: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub disk_writes: u64,
    pub disk_writes_sha256: String,
}

impl RunResult {
    fn of(outputs: &AgentOutputs, disk_writes: u64, disk_writes_sha256: &str) -> Self {
        RunResult {
            exit_status: outputs.finished.map(CommandOutcome::shell_status),
            signaled: matches!(outputs.finished, Some(CommandOutcome::Signaled(_))),
            stdout: outputs.stdout.clone(),
            stderr: outputs.stderr.clone(),
            disk_writes,
            disk_writes_sha256: disk_writes_sha256.to_owned(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same exit status, output and disk writes.
    Identical,
    /// An error message and a nonzero exit status.
    Handled,
    /// Killed by a signal, or the guest crashed (`why`).
    Crashed(String),
    /// Exit status 0, with different output or disk writes.
    SilentlyDifferent,
    /// A nonzero exit status without an error message of its own.
    FailedSilently,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Identical => f.write_str(
                "identical (the same exit status, output and disk writes as the recording)",
            ),
            Verdict::Handled => f.write_str("handled (an error message and a nonzero exit status)"),
            Verdict::Crashed(why) => write!(f, "crashed ({why})"),
            Verdict::SilentlyDifferent => {
                f.write_str("silently different (exit status 0, with different results)")
            }
            Verdict::FailedSilently => {
                f.write_str("failed silently (a nonzero exit status, with no error message)")
            }
        }
    }
}

/// The recording's result against the fork's.
pub struct Comparison {
    pub recorded: RunResult,
    pub fork: RunResult,
    pub verdict: Verdict,
}

impl Comparison {
    /// `failure`: why the fork's live part ended before the guest's
    /// power-off, if it did.
    pub fn new(
        summary: &LogSummary,
        recorded: &Outcome,
        fork: &AgentOutputs,
        totals: &LogTotals,
        failure: Option<String>,
    ) -> Self {
        let recorded = RunResult::of(
            &summary.outputs,
            recorded.disk_writes,
            &recorded.disk_writes_sha256,
        );
        let fork = RunResult::of(fork, totals.disk_writes, &totals.disk_writes_sha256);
        let verdict = verdict(&recorded, &fork, failure);
        Comparison {
            recorded,
            fork,
            verdict,
        }
    }
}

fn verdict(recorded: &RunResult, fork: &RunResult, failure: Option<String>) -> Verdict {
    if let Some(why) = failure {
        return Verdict::Crashed(why);
    }
    if fork.signaled {
        let signal = fork.exit_status.map_or(0, |status| status - 128);
        return Verdict::Crashed(format!("killed by signal {signal}"));
    }
    if fork == recorded {
        return Verdict::Identical;
    }
    let new_message = !fork.stderr.is_empty() && fork.stderr != recorded.stderr;
    match fork.exit_status {
        Some(0) => Verdict::SilentlyDifferent,
        _ if new_message => Verdict::Handled,
        _ => Verdict::FailedSilently,
    }
}

/// The comparison as `provm replay --fork-at` prints it.
impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (recorded, fork) = (&self.recorded, &self.fork);
        let status = |result: &RunResult| {
            result
                .exit_status
                .map_or("none (it did not finish)".to_owned(), |s| s.to_string())
        };
        writeln!(f, "{:<12} {:<28} fork", "", "recorded")?;
        row(
            f,
            "exit status",
            status(recorded),
            status(fork),
            recorded.exit_status == fork.exit_status,
        )?;
        let bytes = |output: &Vec<u8>| format!("{} bytes", output.len());
        row(
            f,
            "stdout",
            bytes(&recorded.stdout),
            bytes(&fork.stdout),
            recorded.stdout == fork.stdout,
        )?;
        row(
            f,
            "stderr",
            bytes(&recorded.stderr),
            bytes(&fork.stderr),
            recorded.stderr == fork.stderr,
        )?;
        let writes = |result: &RunResult| {
            format!(
                "{}, sha256 {}",
                result.disk_writes,
                &result.disk_writes_sha256[..12.min(result.disk_writes_sha256.len())]
            )
        };
        row(
            f,
            "disk writes",
            writes(recorded),
            writes(fork),
            recorded.disk_writes_sha256 == fork.disk_writes_sha256,
        )?;
        for (name, was, is) in [
            ("stdout", &recorded.stdout, &fork.stdout),
            ("stderr", &recorded.stderr, &fork.stderr),
        ] {
            if was != is {
                write!(f, "{name} of the recording:\n{}", Quoted(was))?;
                write!(f, "{name} of the fork:\n{}", Quoted(is))?;
            }
        }
        writeln!(f, "verdict: {}", self.verdict)
    }
}

/// One line of the table: the recording's value, the fork's, and a mark
/// if they differ.
fn row(f: &mut fmt::Formatter<'_>, name: &str, was: String, is: String, same: bool) -> fmt::Result {
    let changed = if same { "" } else { "  <- changed" };
    writeln!(f, "{name:<12} {was:<28} {is}{changed}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: i32, stdout: &str, stderr: &str, disk: &str) -> RunResult {
        RunResult {
            exit_status: Some(status),
            signaled: status > 128,
            stdout: stdout.into(),
            stderr: stderr.into(),
            disk_writes: 1,
            disk_writes_sha256: disk.into(),
        }
    }

    #[test]
    fn verdicts() {
        let recorded = result(0, "done\n", "", "aa");
        let verdict_of = |fork: RunResult| verdict(&recorded, &fork, None);
        assert_eq!(verdict_of(recorded.clone()), Verdict::Identical);
        assert_eq!(
            verdict_of(result(1, "", "write: I/O error\n", "aa")),
            Verdict::Handled
        );
        assert_eq!(
            verdict_of(result(0, "done\n", "", "bb")),
            Verdict::SilentlyDifferent
        );
        assert_eq!(
            verdict_of(result(2, "done\n", "", "aa")),
            Verdict::FailedSilently
        );
        assert_eq!(
            verdict_of(result(139, "", "", "aa")),
            Verdict::Crashed("killed by signal 11".into())
        );
        assert_eq!(
            verdict(&recorded, &recorded, Some("a kernel panic".into())),
            Verdict::Crashed("a kernel panic".into())
        );
    }
}
