//! The replayer seam and the loop that drives a restored VM with it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use provm_guest_agent::{FrameReader, GuestMessage};
use provm_trace::event_log::{DiskWritesDigest, EventStream};
use provm_trace::events::Event;
use provm_trace::format::FormatError;
use provm_trace::manifest::{FinalStateCheck, Outcome};
use provm_trace::page_digests::{CheckPoint, PageDifference, PageDigests};
use provm_vmm::clock::Clock;
use provm_vmm::guest_debug::DebugStop;
use provm_vmm::seam::{Delivery, Exit, Place, Seam};
use provm_vmm::state_digest::{MemoryDigest, StateDigest};
use provm_vmm::vm::{Vm, VmError, VmEvent};

use crate::exit_event;
use crate::state_check;

/// How many events before a divergence its report shows.
const CONTEXT: usize = 12;
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

/// What a replay does at a debug stop (see `Vm::set_guest_debug`); the
/// replay goes on when it returns. It may look at the guest and change the
/// breakpoints, but must not change the guest.
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

pub trait StopHandler {
    fn stopped(&mut self, vm: &mut Vm, stop: DebugStop, at: Position) -> Result<(), VmError>;
}

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

    /// Pauses the replay at the first VM exit at or after log event
    /// `event` (`None`: no pause).
    pub fn pause_at(&self, event: Option<u64>) {
        self.state.lock().unwrap().pause_at = event;
    }

    /// The log position of the last place the replay could pause: right
    /// after the last VM exit (or where `rewind` put it). Between two exits
    /// the guest runs without touching the log, so this names the stretch
    /// a debug stop is in, and `pause_at` with it stops at that stretch's
    /// start.
    pub fn pause_place(&self) -> u64 {
        self.state.lock().unwrap().pause_place
    }

    /// Where the replay stands, to come back to with `rewind`. Take it at a
    /// pause, with the VM's snapshot.
    pub fn checkpoint(&self) -> Checkpoint {
        let state = self.state.lock().unwrap();
        Checkpoint {
            position: state.position,
            exits: state.exits,
            clock_ns: state.clock_ns,
            recent: state.recent.clone(),
            vcpu: state.vcpu,
            disk_writes: state.disk_writes.clone(),
            agent_frames: state.agent_frames.clone(),
            exit_status: state.exit_status,
            disk_accesses: self.disk_error.lock().unwrap().1,
            state_checks: state.state_checks,
        }
    }

    /// Puts the replay back at `to`, reading the log from `events` (the
    /// trace's log from its start) on from there. The VM must be restored
    /// from the snapshot taken with `to`.
    pub fn rewind(&self, to: &Checkpoint, mut events: EventStream) -> Result<(), FormatError> {
        for _ in 0..to.position {
            events.next_event()?;
        }
        let mut state = self.state.lock().unwrap();
        state.events = events;
        state.position = to.position;
        state.exits = to.exits;
        state.clock_ns = to.clock_ns;
        state.recent = to.recent.clone();
        state.vcpu = to.vcpu;
        state.disk_writes = to.disk_writes.clone();
        state.agent_frames = to.agent_frames.clone();
        state.exit_status = to.exit_status;
        state.state_checks = to.state_checks;
        state.final_check = None;
        state.divergence = None;
        state.error = None;
        state.pause_at = None;
        state.pause_place = to.position;
        state.last_exit = Instant::now();
        self.disk_error.lock().unwrap().1 = to.disk_accesses;
        Ok(())
    }

    /// The replay goes on after the host held it stopped (a debugger's
    /// stop): that time is not the guest spinning without exits.
    pub fn resumed(&self) {
        self.state.lock().unwrap().last_exit = Instant::now();
    }

    /// Whether the log has no event left.
    pub fn at_end_of_log(&self) -> bool {
        self.state.lock().unwrap().at_end_of_log()
    }

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
        if let Some(error) = self.state.lock().unwrap().error.take() {
            return Err(VmError::Stopped(error));
        }
        Ok(self.verdict(powered_off, rip))
    }

    /// The VM stopped by itself (`why`), not where the seam stopped it: a
    /// divergence unless the log of a recording cut short ends here.
    fn vm_ended(&self, why: String) {
        let mut state = self.state.lock().unwrap();
        if state.divergence.is_none() && (state.recorded.complete || !state.at_end_of_log()) {
            state.diverge(why);
        }
    }

    /// How the replay ended, once the VM has stopped: `powered_off` if the
    /// guest halted for good, with `rip` its instruction pointer.
    fn verdict(&self, powered_off: bool, rip: u64) -> ReplayEnd {
        let mut state = self.state.lock().unwrap();
        if state.divergence.is_none() {
            if !state.at_end_of_log() {
                state.diverge(if powered_off {
                    "the guest halted for good".into()
                } else {
                    "the replay stopped".into()
                });
            } else if state.recorded.complete {
                state.check_outcome(powered_off);
            }
        }
        let (events, guest_ns, state_checks) = (state.position, state.clock_ns, state.state_checks);
        match state.divergence.clone() {
            Some(divergence) => ReplayEnd::Diverged { divergence, rip },
            None if state.recorded.complete => ReplayEnd::Matched {
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

/// The replayer's side of a snapshot of a replay taken at a pause: where
/// it stands in the log and what it has checked so far. Restoring the VM's
/// snapshot and rewinding to this puts the whole replay back there.
#[derive(Clone)]
pub struct Checkpoint {
    position: u64,
    exits: u64,
    clock_ns: u64,
    recent: VecDeque<(u64, Event)>,
    vcpu: Option<u8>,
    disk_writes: DiskWritesDigest,
    agent_frames: FrameReader,
    exit_status: Option<i32>,
    /// Disk accesses made so far (see `Replayer::disk_error`).
    disk_accesses: u64,
    state_checks: u64,
}

impl Checkpoint {
    pub fn position(&self) -> Position {
        Position {
            events: self.position,
            exits: self.exits,
            guest_ns: self.clock_ns,
        }
    }
}

/// Replays without stopping.
struct NoStops;

impl StopHandler for NoStops {
    fn stopped(&mut self, _: &mut Vm, _: DebugStop, _: Position) -> Result<(), VmError> {
        Ok(())
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

    fn divergence_at(&self, expected: Expected, actual: String) -> Divergence {
        Divergence {
            event: self.position,
            exit: self.exits,
            expected,
            actual,
            recent: self.recent.iter().cloned().collect(),
            pages: None,
            vcpu: self.vcpu,
        }
    }

    /// The pages whose digests differ at the check `at` from `replayed`'s,
    /// if the recording kept that check's.
    fn pages_differing(&self, at: CheckPoint, replayed: &[u16]) -> Option<Vec<PageDifference>> {
        let recorded = self.page_digests.iter().find(|check| check.at == at)?;
        Some(recorded.differences(replayed))
    }

    /// The replay ended (`why`) where the log holds its next event, or ends.
    fn diverge(&mut self, why: String) {
        let expected = match self.events.next_event() {
            Ok(Some(event)) => Expected::Event(event),
            _ => Expected::EndOfLog,
        };
        self.divergence = Some(self.divergence_at(expected, why));
    }

    /// At the end of a complete trace's log: the guest must have powered
    /// off, with the recorded exit status and disk writes.
    fn check_outcome(&mut self, powered_off: bool) {
        let status = |status: Option<i32>| {
            status.map_or("no exit status".to_owned(), |s| format!("exit status {s}"))
        };
        let replayed_disk = self.disk_writes.hex();
        let (expected, actual) = if !powered_off {
            (
                "the guest's power-off".to_owned(),
                "the replay stopped".to_owned(),
            )
        } else if self.exit_status != self.recorded.exit_status {
            (status(self.recorded.exit_status), status(self.exit_status))
        } else if replayed_disk != self.recorded.disk_writes_sha256 {
            let digest = |sha256: &str| format!("disk writes with SHA-256 {sha256}");
            (
                digest(&self.recorded.disk_writes_sha256),
                digest(&replayed_disk),
            )
        } else if let Some(differs) = self.final_check_difference() {
            (
                "the recorded machine state at the guest's power-off".to_owned(),
                format!("state check at event {}: {differs}", self.position),
            )
        } else {
            return;
        };
        let mut divergence = self.divergence_at(Expected::Outcome(expected), actual);
        let memory_differs = matches!(
            (&self.recorded.final_check, &self.final_check),
            (Some(recorded), Some(replayed)) if recorded.memory != replayed.memory
        );
        if let (true, Some(pieces)) = (memory_differs, &self.final_pieces) {
            divergence.pages = self.pages_differing(CheckPoint::PowerOff, pieces);
        }
        self.divergence = Some(divergence);
    }

    /// What differs in the replayed machine's final state from the
    /// recorded one, if the recording checked it; counts the check if
    /// nothing does.
    fn final_check_difference(&mut self) -> Option<String> {
        let recorded = self.recorded.final_check.as_ref()?;
        let Some(replayed) = &self.final_check else {
            return Some("the machine state (not taken at the replay's power-off) differs".into());
        };
        let mut replayed = replayed.clone();
        if self.registers_unchecked {
            replayed.registers.clone_from(&recorded.registers);
        }
        let differs = recorded.first_difference(&replayed);
        self.state_checks += u64::from(differs.is_none());
        differs
    }

    /// Notes the command's exit status when the agent's output reports it.
    /// A bad frame is said once; the output is still compared with the log.
    fn watch_agent(&mut self, bytes: &[u8]) {
        let already_broken = self.agent_frames.is_broken();
        self.agent_frames.push(bytes);
        loop {
            match self.agent_frames.next_frame() {
                Ok(Some((kind, payload))) => {
                    if let Ok(GuestMessage::Finished(outcome)) =
                        GuestMessage::decode(kind, &payload)
                    {
                        self.exit_status = Some(outcome.shell_status());
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    if !already_broken {
                        tracing::warn!(
                            "the agent's output cannot be read past a bad frame ({error}): \
                             the replay compares its bytes but cannot tell the command's exit status"
                        );
                    }
                    break;
                }
            }
        }
    }

    /// A divergence if the guest has run longer than the recording allows
    /// without the exit the log says comes next: it diverged and spins.
    fn check_spinning(&mut self) {
        let spinning = self.last_exit.elapsed();
        if self.divergence.is_some() || spinning < self.recorded.exitless_limit {
            return;
        }
        let next_is_exit = matches!(self.events.peek(), Ok(Some(event)) if event.is_exit());
        if next_is_exit {
            self.diverge(format!(
                "no VM exit for {} s: the guest spins where the recording exited",
                spinning.as_secs()
            ));
        }
    }
}

impl Clock for Replayer {
    fn monotonic_ns(&self) -> u64 {
        match self.expect(
            || "a clock reading".into(),
            |e| matches!(e, Event::Clock(_)),
        ) {
            Some(Event::Clock(ns)) => ns,
            _ => self.state.lock().unwrap().clock_ns,
        }
    }

    fn wall_ns(&self) -> u64 {
        match self.expect(
            || "a wall-clock reading".into(),
            |e| matches!(e, Event::Wall(_)),
        ) {
            Some(Event::Wall(ns)) => ns,
            _ => 0,
        }
    }
}

impl Seam for Replayer {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    /// Only where the recording waited at window exits: its next event,
    /// if that is one.
    fn logged_window(&self) -> Option<Place> {
        if self.delivery != Delivery::LoggedWindow {
            return None;
        }
        match self.state.lock().unwrap().events.peek() {
            Ok(Some(Event::InterruptWindow { at })) => Some(Place {
                rip: at.rip,
                registers: at.registers,
            }),
            _ => None,
        }
    }

    /// The logged clock says when the guest woke: no need to wait.
    fn wait_until(&self, _: u64, _: Instant) {}

    fn exit(&self, exit: Exit<'_>, at: Place) {
        self.state.lock().unwrap().last_exit = Instant::now();
        let actual = exit_event(exit, at);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn read_result(&self, data: &[u8]) {
        let actual = Event::ReadResult(data.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn injected(&self, vector: u8) {
        let actual = Event::Inject(vector);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    /// Where the recording switched vCPUs, the replay does, to the vCPU it
    /// did: the schedule is the log's. A switch the log has at another
    /// exit shows as the next exit differing, on the vCPU named.
    fn schedule(&self, _proposed: Option<usize>) -> Option<usize> {
        let next = self
            .state
            .lock()
            .unwrap()
            .events
            .peek()
            .ok()
            .flatten()
            .cloned();
        let Some(Event::Switch(cpu)) = next else {
            return None;
        };
        self.expect(|| format!("switch to vCPU {cpu}"), |_| true)
            .map(|_| usize::from(cpu))
    }

    fn agent_input(&self, bytes: &[u8]) {
        let actual = Event::AgentInput(bytes.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn agent_output(&self, bytes: &[u8]) {
        let actual = Event::AgentOutput(bytes.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
        self.state.lock().unwrap().watch_agent(bytes);
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        self.state.lock().unwrap().disk_writes.add(offset, data);
        let actual = Event::disk_write(offset, data);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn net_send(&self, frame: &[u8]) {
        let actual = Event::net_sent(frame);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    /// The frame the recording received here, if it received one: the
    /// replay needs no network.
    fn net_receive(&self) -> Option<Vec<u8>> {
        let next_is_frame = matches!(
            self.state.lock().unwrap().events.peek(),
            Ok(Some(Event::NetReceived(_)))
        );
        if !next_is_frame {
            return None;
        }
        let frame = self.expect(
            || "a network frame".into(),
            |e| matches!(e, Event::NetReceived(_)),
        );
        match frame {
            Some(Event::NetReceived(frame)) => Some(frame),
            _ => None,
        }
    }

    /// Also stops at the end of the log: a recording cut short (timeout,
    /// Ctrl-C, a spinning guest) ends between two exits, and the replay
    /// must stop there too rather than run on unchecked. Checked at every
    /// exit and every kick of the vCPU.
    fn stop_reason(&self) -> Option<String> {
        let mut state = self.state.lock().unwrap();
        if let Some(error) = &state.error {
            return Some(error.clone());
        }
        state.check_spinning();
        if state.divergence.is_some() {
            return Some("the replay diverged".into());
        }
        // A recording's host sends between runs of the VM; a fork's live
        // part may send where the replayed part stopped (see `fork`).
        if matches!(state.events.peek(), Ok(Some(Event::AgentInput(_)))) {
            return Some("the host's input is due".into());
        }
        state.at_end_of_log().then(|| "the end of the log".into())
    }

    fn disk_access_fails(&self, _write: bool) -> bool {
        let mut disk_error = self.disk_error.lock().unwrap();
        disk_error.1 += 1;
        disk_error.0 == Some(disk_error.1)
    }

    /// Where the log has a memory check next: the recorder took one at
    /// this exit.
    fn memory_check_due(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        state.divergence.is_none()
            && matches!(state.events.peek(), Ok(Some(Event::StateCheck { .. })))
    }

    fn memory_checked(&self, digest: MemoryDigest) {
        let event = self.position().events;
        let whole = digest.whole;
        let actual = Event::StateCheck { memory: whole };
        let matched = self.expect(
            || format!("state check at event {event}: memory differs (digest {whole:016x})"),
            |e| *e == actual,
        );
        let mut state = self.state.lock().unwrap();
        if matched.is_some() {
            state.state_checks += 1;
            return;
        }
        let pages = state.pages_differing(CheckPoint::Event(event), &digest.pieces);
        if let Some(divergence) = state.divergence.as_mut() {
            if divergence.event == event && divergence.actual.starts_with("state check") {
                divergence.pages = pages;
            }
        }
    }

    fn final_check_due(&self) -> bool {
        self.state.lock().unwrap().recorded.final_check.is_some()
    }

    fn final_state(&self, digest: &StateDigest) {
        let mut state = self.state.lock().unwrap();
        state.final_check = Some(state_check::recorded(digest));
        state.final_pieces = Some(digest.memory.pieces.clone());
    }

    fn pause_here(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        state.pause_place = state.position;
        let due = state.pause_at.is_some_and(|event| state.position >= event);
        if due {
            state.pause_at = None;
        }
        due
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
