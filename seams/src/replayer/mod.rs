//! The replayer seam: at replay time the clock and every input come from
//! the trace's log, and every output the guest produces is compared with
//! it. Its jobs, a module each:
//! - here: the replayer's state and the one step every crossing takes,
//!   consuming the log's next event if it matches (`expect`);
//! - `seam`: the crossings themselves (`Seam` and `Clock`);
//! - `driver`: the loops that drive a restored VM through the log, handing
//!   debug stops to an observer;
//! - `rewind`: pausing a replay and putting it back at a checkpoint (time
//!   travel);
//! - `verdict`: how a replay ended, and where it diverged.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use provm_guest_agent::FrameReader;
use provm_trace::event_log::{DiskWritesDigest, EventStream};
use provm_trace::events::Event;
use provm_trace::manifest::FinalStateCheck;
use provm_trace::page_digests::PageDigests;
use provm_vmm::seam::Delivery;

mod driver;
mod rewind;
mod seam;
mod verdict;

pub use driver::{ObservedError, StopHandler, Stopped};
pub use rewind::Checkpoint;
pub use verdict::{Divergence, Expected, RecordedEnd, ReplayEnd};

/// How many events before a divergence its report shows.
const CONTEXT: usize = 12;

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

struct State {
    events: EventStream,
    recorded: RecordedEnd,
    /// Events consumed so far.
    position: u64,
    exits: u64,
    /// When the guest last exited (host time), to notice it spinning.
    last_exit: Instant,
    clock_ns: u64,
    recent: VecDeque<(u64, Event)>,
    /// The running vCPU, once the log switched vCPUs (`Event::Switch`).
    vcpu: Option<u8>,
    divergence: Option<Divergence>,
    /// A trace that could not be read mid-replay.
    error: Option<String>,
    disk_writes: DiskWritesDigest,
    agent_frames: FrameReader,
    /// The exit status the replayed agent reported, once it has.
    exit_status: Option<i32>,
    /// Pause at the first exit at or after this event (`pause_at`).
    pause_at: Option<u64>,
    /// Events consumed at the last place the replay could pause (see
    /// `Replayer::pause_place`).
    pause_place: u64,
    /// The state checks that matched so far.
    state_checks: u64,
    /// The replayed machine's state at its power-off, once it powered off.
    final_check: Option<FinalStateCheck>,
    /// See `Replayer::skip_register_check`.
    registers_unchecked: bool,
    /// The recording's page digests, check by check (`with_page_digests`).
    page_digests: Vec<PageDigests>,
    /// The replayed memory's piece digests at its power-off.
    final_pieces: Option<Vec<u16>>,
}

impl Replayer {
    /// A replayer over `events`, recorded ending as `recorded` says; the
    /// clock starts at `start_ns` (the snapshot's virtual time).
    pub fn new(events: EventStream, start_ns: u64, recorded: RecordedEnd) -> Self {
        Replayer {
            state: Mutex::new(State {
                events,
                recorded,
                position: 0,
                exits: 0,
                last_exit: Instant::now(),
                clock_ns: start_ns,
                recent: VecDeque::with_capacity(CONTEXT),
                vcpu: None,
                divergence: None,
                error: None,
                disk_writes: DiskWritesDigest::default(),
                agent_frames: FrameReader::default(),
                exit_status: None,
                pause_at: None,
                pause_place: 0,
                state_checks: 0,
                final_check: None,
                registers_unchecked: false,
                page_digests: Vec::new(),
                final_pieces: None,
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
        self.state.lock().unwrap().page_digests = checks;
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
        self.state.lock().unwrap().registers_unchecked = true;
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
        let state = self.state.lock().unwrap();
        Position {
            events: state.position,
            exits: state.exits,
            guest_ns: state.clock_ns,
        }
    }

    /// Bytes the host sent to the agent at this point of the recording, if
    /// the next logged event is such an input.
    pub fn pending_agent_input(&self) -> Option<Vec<u8>> {
        let mut state = self.state.lock().unwrap();
        match state.events.peek() {
            Ok(Some(Event::AgentInput(bytes))) => Some(bytes.clone()),
            _ => None,
        }
    }

    /// The first divergence, once there is one.
    pub fn divergence(&self) -> Option<Divergence> {
        self.state.lock().unwrap().divergence.clone()
    }

    /// Whether the log has no event left.
    pub fn at_end_of_log(&self) -> bool {
        self.state.lock().unwrap().at_end_of_log()
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
        if state.divergence.is_some() || state.error.is_some() {
            return None;
        }
        let next = match state.events.next_event() {
            Ok(next) => next,
            Err(error) => {
                state.error = Some(format!("cannot read the trace: {error}"));
                return None;
            }
        };
        match next {
            Some(event) if matches(&event) => {
                if let Some(tap) = self.tap.lock().unwrap().as_mut() {
                    tap.event(state.position, &event);
                }
                state.consumed(event.clone());
                Some(event)
            }
            None if !state.recorded.complete => None,
            other => {
                let expected = other.map_or(Expected::EndOfLog, Expected::Event);
                state.divergence = Some(state.divergence_at(expected, actual()));
                None
            }
        }
    }
}

impl State {
    fn consumed(&mut self, event: Event) {
        self.exits += u64::from(event.is_exit());
        match event {
            Event::Clock(ns) => self.clock_ns = ns,
            Event::Switch(cpu) => self.vcpu = Some(cpu),
            _ => {}
        }
        if self.recent.len() == CONTEXT {
            self.recent.pop_front();
        }
        self.recent.push_back((self.position, event));
        self.position += 1;
    }

    fn at_end_of_log(&mut self) -> bool {
        matches!(self.events.peek(), Ok(None))
    }
}
