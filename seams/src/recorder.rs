//! The recorder: the seam at record time. The guest's clock is host time
//! (or, pinned, logical time), ticks wait for exits, and every crossing is
//! appended to the event log, which goes to the trace in compressed chunks
//! as the guest runs. A pinned `provm run` uses it too, with no trace: only
//! the log's digest is kept.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use provm_trace::event_log::{EventLogWriter, LogTotals};
use provm_trace::events::Event;
use provm_trace::format::{FormatError, SectionWriter};
use provm_trace::manifest::FinalStateCheck;
use provm_trace::page_digests::{self, CheckPoint, PageDigests};
use provm_vmm::clock::{Clock, HostClock, PinnedClock};
use provm_vmm::network::{HostNetwork, Network};
use provm_vmm::seam::{Delivery, Exit, Place, Seam};
use provm_vmm::state_digest::{MemoryDigest, StateDigest};

use crate::clock::RecorderClock;
use crate::exit_event;
use crate::host_requests::HostRequests;
use crate::state_check;

pub struct Recorder {
    clock: RecorderClock,
    log: Mutex<Log>,
    /// What the host asks from outside: to end the recording (Ctrl-C), or
    /// to signal the command, at the next exit.
    requests: &'static HostRequests,
    /// Host time spent appending to the log (`Seam::logging_ns`).
    logging_ns: AtomicU64,
    /// Where interrupts are delivered (`delivering`).
    delivery: Delivery,
    /// After how long without an exit the guest is preempted, if it is
    /// (`preempting`).
    preemption_quantum: Option<Duration>,
    /// Whether computations that end are preempted too.
    preempts_computations: bool,
    /// When the guest last exited (host time), and the longest stretch
    /// between two exits so far (`longest_exitless`).
    exits: Mutex<(Instant, Duration)>,
    /// Events between two memory checks, if it takes state checks
    /// (`state_check`): a recorder with a trace does, unless switched off.
    memory_check_events: Option<u64>,
    /// The state check at the guest's power-off, once taken.
    final_check: Mutex<Option<FinalStateCheck>>,
    /// The page digests of the checks taken so far, as the trace's
    /// section holds them (`page_digests::encode_check`).
    page_digests: Mutex<Vec<u8>>,
    /// The network the guest's network card is connected to (`--net`).
    network: Option<HostNetwork>,
}

struct Log {
    /// `None` once finished.
    writer: Option<EventLogWriter>,
    /// The first failure to write the trace; it stops the run.
    error: Option<String>,
    /// The log's length at the last memory check.
    checked_at: u64,
}

impl Log {
    fn record(&mut self, append: impl FnOnce(&mut EventLogWriter) -> Result<(), FormatError>) {
        let writer = self.writer.as_mut().expect("the log is open until finish");
        if let Err(error) = append(writer) {
            self.error.get_or_insert(error.to_string());
        }
    }
}

impl Recorder {
    /// A recorder appending to `trace`, whose clock starts at `start_ns` (the
    /// snapshot's virtual time).
    pub fn new(trace: SectionWriter, start_ns: u64, requests: &'static HostRequests) -> Self {
        Self::logging_to(
            EventLogWriter::new(trace, start_ns),
            RecorderClock::Host(HostClock::starting_at(start_ns)),
            requests,
            true,
        )
    }

    /// A recorder of a pinned run, whose guest time is `clock`: appending
    /// to `trace`, or with none only digesting the log.
    pub fn pinned(
        trace: Option<SectionWriter>,
        clock: PinnedClock,
        requests: &'static HostRequests,
    ) -> Self {
        let start_ns = clock.monotonic_ns();
        let traced = trace.is_some();
        let writer = match trace {
            Some(trace) => EventLogWriter::new(trace, start_ns),
            None => EventLogWriter::digest_only(start_ns),
        };
        // Without a trace there is no replay to check.
        Self::logging_to(writer, RecorderClock::Pinned(clock), requests, traced)
    }

    /// A recorder of a fork's live part (see `provm::fork`): appending to
    /// `writer`, which holds the replayed part of the log, in logical time.
    pub fn continuing(
        writer: EventLogWriter,
        clock: PinnedClock,
        requests: &'static HostRequests,
    ) -> Self {
        Self::logging_to(writer, RecorderClock::Pinned(clock), requests, true)
    }

    fn logging_to(
        writer: EventLogWriter,
        clock: RecorderClock,
        requests: &'static HostRequests,
        traced: bool,
    ) -> Self {
        let checked_at = writer.events();
        Recorder {
            clock,
            log: Mutex::new(Log {
                writer: Some(writer),
                error: None,
                checked_at,
            }),
            requests,
            logging_ns: AtomicU64::new(0),
            delivery: Delivery::Doorbell,
            preemption_quantum: None,
            preempts_computations: false,
            exits: Mutex::new((Instant::now(), Duration::ZERO)),
            memory_check_events: state_check::interval().filter(|_| traced),
            final_check: Mutex::new(None),
            page_digests: Mutex::new(Vec::new()),
            network: None,
        }
    }

    /// Connects the guest's network card to `network`: the frames it
    /// receives from it are logged whole, those it sends as digests.
    pub fn with_network(mut self, network: Box<dyn Network>) -> Self {
        self.network = Some(HostNetwork::new(network));
        self
    }

    /// The state check taken when the guest powered off, if it was.
    pub fn final_check(&self) -> Option<FinalStateCheck> {
        self.final_check.lock().unwrap().clone()
    }

    /// The page digests of the state checks taken, as the trace's "page
    /// digests" section holds them; `None` if it took none.
    pub fn page_digests(&self) -> Option<Vec<u8>> {
        let digests = self.page_digests.lock().unwrap();
        (!digests.is_empty()).then(|| digests.clone())
    }

    fn keep_pages(&self, at: CheckPoint, digest: MemoryDigest) {
        let check = PageDigests {
            at,
            pieces: digest.pieces,
        };
        let encoded = page_digests::encode_check(&check);
        self.page_digests.lock().unwrap().extend(encoded);
    }

    /// The longest the guest ran between two exits (host time): a replay
    /// that goes ten times as long without the exit its log says comes
    /// next has diverged and spins (`RecordedEnd::exitless_limit`).
    pub fn longest_exitless(&self) -> Duration {
        self.exits.lock().unwrap().1
    }

    /// Delivers interrupts the guest cannot take at once as `delivery`
    /// says (the guest's doorbell unless told otherwise); the trace's
    /// manifest must say the same, for the replay.
    pub fn delivering(mut self, delivery: Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// Preempts guest code that has computed for `quantum` without an exit
    /// while a tick or another vCPU waits (`provm_vmm::preemption`); with
    /// `None`, never. With `computations`, a computation that ends too,
    /// not only a loop that never does.
    pub fn preempting(mut self, quantum: Option<Duration>, computations: bool) -> Self {
        self.preemption_quantum = quantum;
        self.preempts_computations = computations;
        self
    }

    fn log(&self, event: Event) {
        self.timed(|log| log.append(&event));
    }

    /// Appends to the log, counting the time it takes.
    fn timed(&self, append: impl FnOnce(&mut EventLogWriter) -> Result<(), FormatError>) {
        let start = Instant::now();
        self.log.lock().unwrap().record(append);
        self.logging_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Writes the last chunk and hands the trace (if it has one) back for
    /// the sections that follow the log.
    pub fn finish(&self) -> Result<(Option<SectionWriter>, LogTotals), FormatError> {
        let mut log = self.log.lock().unwrap();
        log.writer
            .take()
            .expect("a recorder finishes once")
            .finish()
    }
}

impl Clock for Recorder {
    fn monotonic_ns(&self) -> u64 {
        let now = self.clock.monotonic_ns();
        self.log(Event::Clock(now));
        now
    }

    fn wall_ns(&self) -> u64 {
        let now = self.clock.wall_ns();
        self.log(Event::Wall(now));
        now
    }
}

impl Seam for Recorder {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    fn preemption_quantum(&self) -> Option<Duration> {
        self.preemption_quantum
    }

    fn preempts_computations(&self) -> bool {
        self.preempts_computations
    }

    fn wait_until(&self, ns: u64, limit: Instant) {
        self.clock.wait_until(ns, limit);
    }

    fn exit(&self, exit: Exit<'_>, at: Place) {
        let now = Instant::now();
        let mut exits = self.exits.lock().unwrap();
        *exits = (now, exits.1.max(now - exits.0));
        drop(exits);
        self.clock.exit();
        self.log(exit_event(exit, at));
    }

    fn read_result(&self, data: &[u8]) {
        self.log(Event::ReadResult(data.to_vec()));
    }

    fn injected(&self, vector: u8) {
        self.log(Event::Inject(vector));
    }

    fn schedule(&self, proposed: Option<usize>) -> Option<usize> {
        if let Some(cpu) = proposed {
            self.log(Event::Switch(cpu as u8));
        }
        proposed
    }

    fn agent_input(&self, bytes: &[u8]) {
        self.log(Event::AgentInput(bytes.to_vec()));
    }

    fn agent_output(&self, bytes: &[u8]) {
        self.log(Event::AgentOutput(bytes.to_vec()));
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        self.timed(|log| log.append_disk_write(offset, data));
    }

    fn net_send(&self, frame: &[u8]) {
        self.log(Event::net_sent(frame));
        if let Some(network) = &self.network {
            network.send(frame);
        }
    }

    fn net_receive(&self) -> Option<Vec<u8>> {
        let frame = self.network.as_ref()?.receive()?;
        self.log(Event::NetReceived(frame.clone()));
        Some(frame)
    }

    /// A pinned clock has no host time to wait in, and a pinned run no
    /// network.
    fn wait_for_frame_until(&self, ns: u64, limit: Instant) {
        match (&self.network, &self.clock) {
            (Some(network), RecorderClock::Host(clock)) => network.wait(clock, ns, limit),
            _ => self.clock.wait_until(ns, limit),
        }
    }

    fn stop_reason(&self) -> Option<String> {
        if self.requests.ended() {
            return Some("interrupted (Ctrl-C, or a signal that ends the recording)".into());
        }
        self.log.lock().unwrap().error.clone()
    }

    fn host_input_due(&self) -> bool {
        self.requests.input_due()
    }

    fn memory_check_due(&self) -> bool {
        let Some(interval) = self.memory_check_events else {
            return false;
        };
        let log = self.log.lock().unwrap();
        let events = log.writer.as_ref().map_or(0, EventLogWriter::events);
        events >= log.checked_at + interval
    }

    fn memory_checked(&self, digest: MemoryDigest) {
        let event = self
            .log
            .lock()
            .unwrap()
            .writer
            .as_ref()
            .map_or(0, EventLogWriter::events);
        self.log(Event::StateCheck {
            memory: digest.whole,
        });
        self.keep_pages(CheckPoint::Event(event), digest);
        let mut log = self.log.lock().unwrap();
        log.checked_at = log.writer.as_ref().map_or(0, EventLogWriter::events);
    }

    fn final_check_due(&self) -> bool {
        self.memory_check_events.is_some()
    }

    fn final_state(&self, digest: &StateDigest) {
        *self.final_check.lock().unwrap() = Some(state_check::recorded(digest));
        self.keep_pages(CheckPoint::PowerOff, digest.memory.clone());
    }

    fn logging_ns(&self) -> u64 {
        self.logging_ns.load(Ordering::Relaxed)
    }
}
