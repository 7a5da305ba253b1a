//! How a replay ended: matched, cut short where the recording was, or
//! diverged, and the divergence's report.

use std::fmt;
use std::time::Duration;

use provm_trace::events::Event;
use provm_trace::manifest::{FinalStateCheck, Outcome};
use provm_trace::page_digests::PageDifference;
use provm_vmm::vm::{VmError, VmEvent};

use super::{Position, Replayer, State};

/// The shortest time a replayed guest may go without the exit the log
/// says comes next before it is taken for spinning (see `RecordedEnd`).
const MIN_EXITLESS: Duration = Duration::from_secs(60);
/// How many times the whole recording's wall time it may go so.
const EXITLESS_FACTOR: u32 = 10;

/// What the trace's outcome says the replay must end with.
#[derive(Clone, Debug)]
pub struct RecordedEnd {
    /// Whether the recording ran to the guest's power-off; if not, the
    /// replay stops where the log does.
    pub complete: bool,
    /// The command's exit status as a shell reports it.
    pub exit_status: Option<i32>,
    /// SHA-256 over every disk write in order (see `DiskWritesDigest`).
    pub disk_writes_sha256: String,
    /// The longest the replayed guest may run without a VM exit while the
    /// log says one comes next: it has diverged and spins.
    pub exitless_limit: Duration,
    /// The state check at the recorded guest's power-off, if it took one.
    pub final_check: Option<FinalStateCheck>,
}

impl RecordedEnd {
    /// The end `outcome` describes. The exitless limit is ten times the
    /// longest the recorded guest went without an exit, at least 60 s; for
    /// a trace that does not say (older ones, forks), ten times the whole
    /// recording.
    pub fn of(outcome: &Outcome) -> Self {
        let seconds = outcome
            .longest_exitless_seconds
            .unwrap_or(outcome.host_seconds);
        let stretch = Duration::try_from_secs_f64(seconds).unwrap_or_default();
        RecordedEnd {
            complete: outcome.complete,
            exit_status: outcome.exit_status,
            disk_writes_sha256: outcome.disk_writes_sha256.clone(),
            exitless_limit: (stretch * EXITLESS_FACTOR).max(MIN_EXITLESS),
            final_check: outcome.state_check.clone(),
        }
    }
}

/// What the replay should have done where it diverged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// The log's event there.
    Event(Event),
    /// Nothing: a complete trace's log ended.
    EndOfLog,
    /// The recording's outcome (exit status, disk writes), in words.
    Outcome(String),
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::Event(event) => event.fmt(f),
            Expected::EndOfLog => f.write_str("the end of the log"),
            Expected::Outcome(what) => f.write_str(what),
        }
    }
}

/// The first point where the replayed guest did not do what the log says.
#[derive(Debug, Clone)]
pub struct Divergence {
    /// The index of the log event that did not match (0-based).
    pub event: u64,
    /// The VM exits before it.
    pub exit: u64,
    pub expected: Expected,
    /// What the replay did instead.
    pub actual: String,
    /// The events before it, with their indices.
    pub recent: Vec<(u64, Event)>,
    /// Where memory differs, when a state check found it did and the
    /// trace kept the check's page digests (format 8 on).
    pub pages: Option<Vec<PageDifference>>,
    /// The vCPU that was running, in a guest with more than one (from the
    /// log's last switch; vCPU 0 before the first).
    pub vcpu: Option<u8>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event {} (after {} VM exits)", self.event, self.exit)?;
        match self.vcpu {
            Some(vcpu) => writeln!(f, " on vCPU {vcpu}")?,
            None => writeln!(f)?,
        }
        writeln!(f, "  expected: {}", self.expected)?;
        writeln!(f, "  actual:   {}", self.actual)?;
        writeln!(f, "  the events before it:")?;
        for (index, event) in &self.recent {
            writeln!(f, "    {index:>10}  {event}")?;
        }
        Ok(())
    }
}

/// How a replay ended.
#[derive(Clone, Debug)]
pub enum ReplayEnd {
    /// The guest did everything the log says, to its power-off, with the
    /// recording's exit status and disk writes.
    Matched {
        events: u64,
        guest_ns: u64,
        /// The state checks that matched, the final one included (0: a
        /// trace without state checks).
        state_checks: u64,
    },
    /// The recording was cut short, and the guest did everything its log
    /// says up to where it stops: the rest of the run is unchecked.
    CutShort {
        events: u64,
        guest_ns: u64,
        state_checks: u64,
    },
    Diverged {
        divergence: Divergence,
        rip: u64,
    },
}

impl Replayer {
    /// How the replay ended, given why the VM's run returned (`stopped`)
    /// and its instruction pointer then. A VM failure (a stuck guest, a
    /// triple fault, a KVM error) is a divergence; only the time limit and
    /// an unreadable trace are errors.
    pub fn finish(
        &self,
        stopped: Result<VmEvent, VmError>,
        rip: u64,
    ) -> Result<ReplayEnd, VmError> {
        let powered_off = match stopped {
            Ok(VmEvent::Halted) => true,
            Ok(VmEvent::AgentOutput(_) | VmEvent::DebugStop(_) | VmEvent::Paused)
            | Err(VmError::Stopped(_)) => false,
            Ok(VmEvent::Reset) => {
                self.vm_ended("the guest reset".into());
                false
            }
            Err(error @ VmError::Timeout { .. }) => return Err(error),
            Err(error) => {
                self.vm_ended(format!("the VM failed: {error}"));
                false
            }
        };
        if let Some(error) = self.state.lock().unwrap().cursor.take_error() {
            return Err(VmError::Stopped(error));
        }
        Ok(self.verdict(powered_off, rip))
    }

    /// The VM stopped by itself (`why`), not where the seam stopped it: a
    /// divergence unless the log of a recording cut short ends here.
    fn vm_ended(&self, why: String) {
        let mut state = self.state.lock().unwrap();
        let State { cursor, checks, .. } = &mut *state;
        if !checks.diverged() && (checks.recorded().complete || !cursor.at_end()) {
            checks.diverge(cursor.ended_here(why));
        }
    }

    /// How the replay ended, once the VM has stopped: `powered_off` if the
    /// guest halted for good, with `rip` its instruction pointer.
    fn verdict(&self, powered_off: bool, rip: u64) -> ReplayEnd {
        let mut state = self.state.lock().unwrap();
        let State { cursor, checks, .. } = &mut *state;
        if !checks.diverged() {
            if !cursor.at_end() {
                checks.diverge(cursor.ended_here(if powered_off {
                    "the guest halted for good".into()
                } else {
                    "the replay stopped".into()
                }));
            } else if checks.recorded().complete {
                checks.check_outcome(cursor, powered_off);
            }
        }
        let Position {
            events, guest_ns, ..
        } = cursor.position();
        let state_checks = checks.state_checks();
        match checks.divergence().cloned() {
            Some(divergence) => ReplayEnd::Diverged { divergence, rip },
            None if checks.recorded().complete => ReplayEnd::Matched {
                events,
                guest_ns,
                state_checks,
            },
            None => ReplayEnd::CutShort {
                events,
                guest_ns,
                state_checks,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(host_seconds: f64, longest_exitless_seconds: Option<f64>) -> Outcome {
        Outcome {
            host_seconds,
            longest_exitless_seconds,
            ..Outcome::default()
        }
    }

    /// A six-minute recording whose guest never went a second without an
    /// exit: its diverged, spinning replay stops after a minute, not an
    /// hour (the old rule, kept for traces that do not say).
    #[test]
    fn the_spin_limit_follows_the_longest_recorded_stretch_without_exits() {
        let limit = |o: &Outcome| RecordedEnd::of(o).exitless_limit;
        assert_eq!(limit(&outcome(360.0, Some(0.5))), MIN_EXITLESS);
        assert_eq!(limit(&outcome(360.0, Some(30.0))), Duration::from_secs(300));
        assert_eq!(limit(&outcome(360.0, None)), Duration::from_secs(3600));
        assert_eq!(limit(&outcome(1.0, None)), MIN_EXITLESS);
    }
}
