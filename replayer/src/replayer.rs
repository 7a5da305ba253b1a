//! The replayer seam and the loop that drives a restored VM with it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

use provm_recorder::exit_event;
use provm_trace::event_log::EventStream;
use provm_trace::events::Event;
use provm_vmm::clock::Clock;
use provm_vmm::seam::{Exit, Seam};
use provm_vmm::vm::{Vm, VmError, VmEvent};

/// How many events before a divergence its report shows.
const CONTEXT: usize = 12;

/// The first point where the replayed guest did not do what the log says.
#[derive(Debug, Clone)]
pub struct Divergence {
    /// The index of the log event that did not match (0-based).
    pub event: u64,
    /// The VM exits before it.
    pub exit: u64,
    /// What the log holds there; `None` past its end.
    pub expected: Option<Event>,
    /// What the replay did instead.
    pub actual: String,
    /// The events before it, with their indices.
    pub recent: Vec<(u64, Event)>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected = self
            .expected
            .as_ref()
            .map_or("the end of the log".to_owned(), Event::to_string);
        writeln!(f, "event {} (after {} VM exits)", self.event, self.exit)?;
        writeln!(f, "  expected: {expected}")?;
        writeln!(f, "  actual:   {}", self.actual)?;
        writeln!(f, "  the events before it:")?;
        for (index, event) in &self.recent {
            writeln!(f, "    {index:>10}  {event}")?;
        }
        Ok(())
    }
}

pub struct Replayer {
    state: Mutex<State>,
}

struct State {
    events: EventStream,
    /// Events consumed so far.
    position: u64,
    exits: u64,
    clock_ns: u64,
    recent: VecDeque<(u64, Event)>,
    divergence: Option<Divergence>,
    /// A trace that could not be read mid-replay.
    error: Option<String>,
}

/// How a replay ended.
pub enum ReplayEnd {
    /// The guest did everything the log says, to its end.
    Matched {
        events: u64,
        guest_ns: u64,
    },
    Diverged {
        divergence: Divergence,
        rip: u64,
    },
}

impl Replayer {
    /// A replayer over `events`; the clock starts at `start_ns` (the
    /// snapshot's virtual time).
    pub fn new(events: EventStream, start_ns: u64) -> Self {
        Replayer {
            state: Mutex::new(State {
                events,
                position: 0,
                exits: 0,
                clock_ns: start_ns,
                recent: VecDeque::with_capacity(CONTEXT),
                divergence: None,
                error: None,
            }),
        }
    }

    /// Bytes the host sent to the agent at this point of the recording, if
    /// the next logged event is such an input.
    fn pending_agent_input(&self) -> Option<Vec<u8>> {
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

    fn at_end_of_log(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        state.divergence.is_none() && matches!(state.events.peek(), Ok(None))
    }

    /// Drives `vm`, restored from the trace's snapshot with this replayer
    /// as its seam, through the whole log.
    pub fn replay(&self, vm: &mut Vm, deadline: Instant) -> Result<ReplayEnd, VmError> {
        loop {
            while let Some(bytes) = self.pending_agent_input() {
                vm.send_to_agent(&bytes);
            }
            if self.at_end_of_log() {
                return Ok(self.matched());
            }
            let ended = match vm.run(deadline) {
                Ok(VmEvent::AgentOutput(_)) => continue,
                Ok(VmEvent::Halted) => "the guest halted for good",
                Ok(VmEvent::Reset) => "the guest reset",
                Err(VmError::Stopped(_)) => "",
                Err(error) => return Err(error),
            };
            let mut state = self.state.lock().unwrap();
            if let Some(error) = state.error.take() {
                return Err(VmError::Stopped(error));
            }
            if state.divergence.is_none() {
                if matches!(state.events.peek(), Ok(None)) {
                    drop(state);
                    return Ok(self.matched());
                }
                state.diverge(ended.to_owned());
            }
            let divergence = state.divergence.clone().expect("set above");
            return Ok(ReplayEnd::Diverged {
                divergence,
                rip: vm.rip(),
            });
        }
    }

    fn matched(&self) -> ReplayEnd {
        let state = self.state.lock().unwrap();
        ReplayEnd::Matched {
            events: state.position,
            guest_ns: state.clock_ns,
        }
    }

    /// Consumes the next event, which must satisfy `matches`; otherwise
    /// records a divergence whose "actual" is `actual`. Returns the event if
    /// it matched.
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
                state.consumed(event.clone());
                Some(event)
            }
            other => {
                state.divergence = Some(state.divergence_at(other, actual()));
                None
            }
        }
    }
}

impl State {
    fn consumed(&mut self, event: Event) {
        self.exits += u64::from(event.is_exit());
        if let Event::Clock(ns) = event {
            self.clock_ns = ns;
        }
        if self.recent.len() == CONTEXT {
            self.recent.pop_front();
        }
        self.recent.push_back((self.position, event));
        self.position += 1;
    }

    fn divergence_at(&self, expected: Option<Event>, actual: String) -> Divergence {
        Divergence {
            event: self.position,
            exit: self.exits,
            expected,
            actual,
            recent: self.recent.iter().cloned().collect(),
        }
    }

    /// The replay ended (`why`) while the log goes on.
    fn diverge(&mut self, why: String) {
        let expected = self.events.next_event().ok().flatten();
        self.divergence = Some(self.divergence_at(expected, why));
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
    fn preemptive(&self) -> bool {
        false
    }

    /// The logged clock says when the guest woke: no need to wait.
    fn wait_until(&self, _: u64, _: Instant) {}

    fn exit(&self, exit: Exit<'_>) {
        let actual = exit_event(exit);
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

    fn agent_input(&self, bytes: &[u8]) {
        let actual = Event::AgentInput(bytes.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn agent_output(&self, bytes: &[u8]) {
        let actual = Event::AgentOutput(bytes.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        let actual = Event::disk_write(offset, data);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    /// Also stops at the end of the log: a recording cut short (timeout,
    /// Ctrl-C, a spinning guest) ends between two exits, and the replay
    /// must stop there too rather than run on unchecked.
    fn stop_reason(&self) -> Option<String> {
        let mut state = self.state.lock().unwrap();
        if let Some(error) = &state.error {
            return Some(error.clone());
        }
        if state.divergence.is_some() {
            return Some("the replay diverged".into());
        }
        matches!(state.events.peek(), Ok(None)).then(|| "the end of the log".into())
    }
}
