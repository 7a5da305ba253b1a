//! The replayer seam: at replay time the clock and every input come from
//! the trace's log, and every output the guest produces is compared with
//! it. Its state has three parts, a module each:
//! - `cursor`: where the replay stands in the log, and its pause points;
//! - `checks`: what the replay is compared with beyond the log's events,
//!   what it has produced so far, and the first divergence;
//! - `agent`: the agent's frames, read for the command's exit status.
//!
//! Its jobs, a module each:
//! - here: the replayer and the one step every crossing takes, consuming
//!   the log's next event if it matches (`expect`);
//! - `seam`: the crossings themselves (`Seam` and `Clock`);
//! - `driver`: the loops that drive a restored VM through the log, handing
//!   debug stops to an observer;
//! - `rewind`: pausing a replay and putting it back at a checkpoint (time
//!   travel);
//! - `verdict`: how a replay ended, and where it diverged.

use std::sync::Mutex;

use provm_trace::event_log::EventStream;
use provm_trace::events::Event;
use provm_trace::page_digests::PageDigests;
use provm_vmm::seam::Delivery;

mod agent;
mod checks;
mod cursor;
mod driver;
mod rewind;
mod seam;
mod verdict;

use agent::AgentFrames;
use checks::Checks;
use cursor::Cursor;
pub use driver::{ObservedError, StopHandler, Stopped};
pub use rewind::Checkpoint;
pub use verdict::{Divergence, Expected, RecordedEnd, ReplayEnd};

/// How far a replay has got: the point an observer stands at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Log events consumed so far: the next one has this index.
    pub events: u64,
    /// VM exits so far.
    pub exits: u64,
    /// The guest's clock (the last logged reading), in nanoseconds.
    pub guest_ns: u64,
}

/// Sees every log event as the replay consumes it, in order.
pub trait EventTap: Send {
    fn event(&mut self, index: u64, event: &Event);
}

/// The replayer seam. Its state is behind a mutex because the VM crosses
/// the seam through `&self`, and the driver and observers read it between
/// crossings.
pub struct Replayer {
    state: Mutex<State>,
    tap: Mutex<Option<Box<dyn EventTap>>>,
    /// A fork's injected disk error: this disk access (counted from 1)
    /// fails, as it did in the fork; and the accesses so far.
    disk_error: Mutex<(Option<u64>, u64)>,
    /// Where interrupts were delivered (`delivering`).
    delivery: Delivery,
}

/// One lock over the three parts, not one each: a crossing looks at the
/// checks (no divergence yet), takes the log's next event and records the
/// divergence it makes in one step, and a checkpoint or a rewind takes or
/// puts back all three at one point of the log. Separate locks would let
/// another thread see the parts at different points.
struct State {
    cursor: Cursor,
    checks: Checks,
    agent: AgentFrames,
}

impl Replayer {
    /// A replayer over `events`, recorded ending as `recorded` says; the
    /// clock starts at `start_ns` (the snapshot's virtual time).
    pub fn new(events: EventStream, start_ns: u64, recorded: RecordedEnd) -> Self {
        Replayer {
            state: Mutex::new(State {
                cursor: Cursor::new(events, start_ns),
                checks: Checks::new(recorded),
                agent: AgentFrames::default(),
            }),
            tap: Mutex::new(None),
            disk_error: Mutex::new((None, 0)),
            delivery: Delivery::Doorbell,
        }
    }

    /// Delivers interrupts as the recording did (its manifest says how;
    /// the guest's doorbell unless told otherwise).
    pub fn delivering(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Compares memory page by page where a state check finds it differs,
    /// against the recording's `checks` (the trace's page digests), so
    /// that the divergence names the pages.
    pub fn with_page_digests(self, checks: Vec<PageDigests>) -> Self {
        self.state.lock().unwrap().checks.set_page_digests(checks);
        self
    }

    /// The final check leaves the vCPU's registers out, comparing memory
    /// and devices only: where a debugger or an analysis sets breakpoints
    /// and steps in this replay (they leave marks in the debug registers
    /// and flags that the recording never had: measured on the SVM test
    /// bed, Linux 6.1), or where this host's KVM or CPU is not the
    /// recording's (another kernel reads other MSRs and state: a trace
    /// recorded on Linux 6.12 differed on 6.1, and one recorded on QEMU's
    /// EPYC-Milan differed on its EPYC, outputs and memory matching).
    pub fn skip_register_check(&self) {
        self.state.lock().unwrap().checks.skip_register_check();
    }

    /// Fails the `access`th disk access, counted from 1 (a fork's trace:
    /// see `Manifest::fork`).
    pub fn fail_disk_access(&self, access: u64) {
        self.disk_error.lock().unwrap().0 = Some(access);
    }

    /// Shows every event the replay consumes to `tap`.
    pub fn set_tap(&self, tap: Box<dyn EventTap>) {
        *self.tap.lock().unwrap() = Some(tap);
    }

    pub fn position(&self) -> Position {
        self.state.lock().unwrap().cursor.position()
    }

    /// Bytes the host sent to the agent at this point of the recording, if
    /// the next logged event is such an input.
    pub fn pending_agent_input(&self) -> Option<Vec<u8>> {
        match self.state.lock().unwrap().cursor.peek() {
            Some(Event::AgentInput(bytes)) => Some(bytes.clone()),
            _ => None,
        }
    }

    /// The first divergence, once there is one.
    pub fn divergence(&self) -> Option<Divergence> {
        self.state.lock().unwrap().checks.divergence().cloned()
    }

    /// Whether the log has no event left.
    pub fn at_end_of_log(&self) -> bool {
        self.state.lock().unwrap().cursor.at_end()
    }

    /// Consumes the next event, which must satisfy `matches`; otherwise
    /// records a divergence whose "actual" is `actual`. Returns the event if
    /// it matched. Past the end of the log of a recording cut short nothing
    /// is checked: the seam stops the VM at its next chance.
    fn expect(
        &self,
        actual: impl FnOnce() -> String,
        matches: impl FnOnce(&Event) -> bool,
    ) -> Option<Event> {
        let mut state = self.state.lock().unwrap();
        let State { cursor, checks, .. } = &mut *state;
        if checks.diverged() || cursor.error().is_some() {
            return None;
        }
        match cursor.take()? {
            Some(event) if matches(&event) => {
                if let Some(tap) = self.tap.lock().unwrap().as_mut() {
                    tap.event(cursor.position().events, &event);
                }
                cursor.consumed(event.clone());
                Some(event)
            }
            None if !checks.recorded().complete => None,
            other => {
                let expected = other.map_or(Expected::EndOfLog, Expected::Event);
                checks.diverge(cursor.divergence_at(expected, actual()));
                None
            }
        }
    }
}
