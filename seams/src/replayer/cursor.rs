//! The log cursor: where a replay stands in the log, reading on from
//! there, and where it may pause. It compares nothing: a crossing takes the
//! next event from it, and the checks decide what a mismatch means.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use provm_trace::event_log::EventStream;
use provm_trace::events::Event;
use provm_trace::format::FormatError;

use super::{Divergence, Expected, Position};

/// How many events before a divergence its report shows.
const CONTEXT: usize = 12;

/// How many times the exitless limit a search for a logged preemption may
/// take in all while it keeps stopping at the preemption's place
/// (`passed_logged_stop`). Its stops cost far more than the guest's passes
/// where the host emulates the CPU: on the SVM test bed a search from a
/// stretch's start made 3,497 stops in 11 s, and another was still
/// stopping when a 60 s limit ended it as a spin.
const SEARCH_ALLOWANCE: u32 = 5;

pub(super) struct Cursor {
    events: EventStream,
    at: Mark,
    /// When the guest last exited (host time), to notice it spinning, or
    /// last stopped at the place of the logged stop it runs to.
    last_exit: Instant,
    /// When the search for the logged stop began, if the guest has stopped
    /// at its place since it last exited.
    search_began: Option<Instant>,
    /// A trace that could not be read mid-replay.
    error: Option<String>,
    /// Pause at the first exit at or after this event (`pause_at`).
    pause_at: Option<u64>,
    /// Events consumed at the last place the replay could pause (see
    /// `Replayer::pause_place`).
    pause_place: u64,
}

/// Where a cursor stands in the log: what a checkpoint keeps to put it
/// back there. The rest of the cursor starts afresh at a rewind.
#[derive(Clone)]
pub(super) struct Mark {
    /// Events consumed so far: the next one has this index.
    position: u64,
    exits: u64,
    /// The guest's clock: the last logged reading.
    clock_ns: u64,
    /// The last events consumed, for a divergence's report.
    recent: VecDeque<(u64, Event)>,
    /// The running vCPU, once the log switched vCPUs (`Event::Switch`).
    vcpu: Option<u8>,
}

impl Mark {
    pub(super) fn position(&self) -> Position {
        Position {
            events: self.position,
            exits: self.exits,
            guest_ns: self.clock_ns,
        }
    }
}

impl Cursor {
    /// A cursor at the start of `events`, the clock at `start_ns`.
    pub(super) fn new(events: EventStream, start_ns: u64) -> Self {
        let start = Mark {
            position: 0,
            exits: 0,
            clock_ns: start_ns,
            recent: VecDeque::with_capacity(CONTEXT),
            vcpu: None,
        };
        Cursor::standing_at(start, events)
    }

    /// A cursor back at `mark`, reading `events` (the log from its start)
    /// on from there.
    pub(super) fn rewound(mark: &Mark, mut events: EventStream) -> Result<Self, FormatError> {
        for _ in 0..mark.position {
            events.next_event()?;
        }
        Ok(Cursor::standing_at(mark.clone(), events))
    }

    /// Nothing is due yet where a replay starts or resumes from a
    /// checkpoint, and the first place it can pause is this one.
    fn standing_at(at: Mark, events: EventStream) -> Self {
        Cursor {
            events,
            pause_place: at.position,
            at,
            last_exit: Instant::now(),
            search_began: None,
            error: None,
            pause_at: None,
        }
    }

    pub(super) fn mark(&self) -> Mark {
        self.at.clone()
    }

    pub(super) fn position(&self) -> Position {
        self.at.position()
    }

    /// The log's next event, left in place. An unreadable trace reads as
    /// no event here: taking it (`take`) says so.
    pub(super) fn peek(&mut self) -> Option<&Event> {
        self.events.peek().ok().flatten()
    }

    /// Whether the log has no event left.
    pub(super) fn at_end(&mut self) -> bool {
        matches!(self.events.peek(), Ok(None))
    }

    /// Takes the log's next event (`None`: the log ended), which counts as
    /// consumed only once the caller says it matched (`consumed`). `None`
    /// if the trace cannot be read: that is the replay's error then.
    pub(super) fn take(&mut self) -> Option<Option<Event>> {
        match self.events.next_event() {
            Ok(next) => Some(next),
            Err(error) => {
                self.error = Some(format!("cannot read the trace: {error}"));
                None
            }
        }
    }

    /// Counts `event`, taken with `take`, as replayed.
    pub(super) fn consumed(&mut self, event: Event) {
        let at = &mut self.at;
        at.exits += u64::from(event.is_exit());
        match event {
            Event::Clock(ns) => at.clock_ns = ns,
            Event::Switch(cpu) => at.vcpu = Some(cpu),
            _ => {}
        }
        if at.recent.len() == CONTEXT {
            at.recent.pop_front();
        }
        at.recent.push_back((at.position, event));
        at.position += 1;
    }

    /// Why the trace could not be read, if it could not.
    pub(super) fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Like `error`, leaving none: the replay's end reports it.
    pub(super) fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }

    /// A divergence here: the replay should have done `expected` and did
    /// `actual`.
    pub(super) fn divergence_at(&self, expected: Expected, actual: String) -> Divergence {
        Divergence {
            event: self.at.position,
            exit: self.at.exits,
            expected,
            actual,
            recent: self.at.recent.iter().cloned().collect(),
            pages: None,
            vcpu: self.at.vcpu,
        }
    }

    /// The replay ended (`why`) here, where the log holds its next event
    /// (taken) or ends.
    pub(super) fn ended_here(&mut self, why: String) -> Divergence {
        let expected = match self.events.next_event() {
            Ok(Some(event)) => Expected::Event(event),
            _ => Expected::EndOfLog,
        };
        self.divergence_at(expected, why)
    }

    /// Starts timing the guest's run without exits afresh: it exited, or
    /// the host held it stopped (a debugger's stop), which is not the guest
    /// spinning.
    pub(super) fn restart_exitless(&mut self) {
        self.last_exit = Instant::now();
        self.search_began = None;
    }

    /// The guest stopped at the place of the logged stop it runs to, in
    /// another state: it is on its way there, not spinning. Its exitless
    /// limit is timed afresh from here, within `SEARCH_ALLOWANCE` times
    /// that limit for the whole search.
    pub(super) fn passed_logged_stop(&mut self) {
        self.search_began.get_or_insert(self.last_exit);
        self.last_exit = Instant::now();
    }

    /// A divergence if the guest has run longer than `limit` without the
    /// exit the log says comes next (it diverged and spins), or has
    /// searched for it for longer than its allowance (it diverged before
    /// the place, which it passes in other states only).
    pub(super) fn spinning(&mut self, limit: Duration) -> Option<Divergence> {
        if !self.peek().is_some_and(Event::is_exit) {
            return None;
        }
        let spinning = self.last_exit.elapsed();
        if spinning >= limit {
            return Some(self.ended_here(format!(
                "no VM exit for {} s: the guest spins where the recording exited",
                spinning.as_secs()
            )));
        }
        let searching = self.search_began?.elapsed();
        (searching >= limit * SEARCH_ALLOWANCE).then(|| {
            self.ended_here(format!(
                "no VM exit for {} s: the guest passed the logged stop's place in other states only",
                searching.as_secs()
            ))
        })
    }

    /// Pauses at the first exit at or after log event `event` (`None`: no
    /// pause).
    pub(super) fn pause_at(&mut self, event: Option<u64>) {
        self.pause_at = event;
    }

    /// See `Replayer::pause_place`.
    pub(super) fn pause_place(&self) -> u64 {
        self.pause_place
    }

    /// The replay can pause here (after an exit): whether it is to, once.
    pub(super) fn pause_here(&mut self) -> bool {
        self.pause_place = self.at.position;
        let due = self.pause_at.is_some_and(|event| self.at.position >= event);
        if due {
            self.pause_at = None;
        }
        due
    }
}
