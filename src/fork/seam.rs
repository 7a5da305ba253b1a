//! The seam of a fork: the replayer up to the fork point, a recorder from
//! there on, in the same VM. Every event goes to the fork's own log, the
//! replayed ones as the replayer checked them, so that the fork's trace
//! replays from the recording's snapshot like any trace.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use provm_seams::{delivery, exit_event, Recorder, Replayer, NO_HOST_REQUESTS};
use provm_trace::event_log::{EventLogWriter, LogTotals};
use provm_trace::events::Event;
use provm_trace::format::{FormatError, SectionWriter};
use provm_vmm::clock::{Clock, PinnedClock, PINNED_EXIT_STEP_NS};
use provm_vmm::seam::{Delivery, Exit, LoggedStop, Place, Seam};
use provm_vmm::state_digest::{MemoryDigest, StateDigest};

/// Why the VM stops once, right after the fork point: the host may have
/// input to send there (see `fork::run_fork`).
pub const AT_FORK_POINT: &str = "the fork point";

/// Where the live part starts.
#[derive(Clone, Copy, Debug)]
pub enum Trigger {
    /// Before the log's event with this index.
    Event(u64),
    /// At the Nth disk read (from 1).
    DiskRead(u64),
}

/// The guest's clock in the live part: logical time, as in a pinned run,
/// carried on from the replayed clock (so that a fork of a pinned
/// recording that injects nothing is that recording again), shifted by a
/// clock fault.
#[derive(Clone, Copy, Debug)]
pub struct LiveClock {
    /// The snapshot's virtual time, and the guest's wall-clock time then
    /// (the job's: what the agent set the guest's clock to).
    pub snapshot_ns: u64,
    pub wall_at_snapshot_ns: u64,
    /// How far the VMM's clock jumps forward at the fork point.
    pub jump_ns: u64,
}

impl LiveClock {
    /// The logical clock of a guest whose clock reads `now_ns`.
    fn at(&self, now_ns: u64) -> PinnedClock {
        let wall = self.wall_at_snapshot_ns + now_ns.saturating_sub(self.snapshot_ns);
        PinnedClock::new(
            now_ns + self.jump_ns,
            wall + self.jump_ns,
            PINNED_EXIT_STEP_NS,
        )
    }
}

pub struct ForkSeam {
    replayer: Replayer,
    trigger: Trigger,
    clock: LiveClock,
    replayed: Mutex<Replayed>,
    live: OnceLock<Recorder>,
    /// The index of the first live event, once live.
    fork_event: OnceLock<u64>,
    /// Set when the fork goes live inside a run of the VM, to stop it there.
    stop_at_fork: AtomicBool,
    disk: Mutex<DiskAccesses>,
}

/// The log of the replayed part, and where its clock stands.
struct Replayed {
    /// Taken by the recorder when the fork goes live.
    writer: Option<EventLogWriter>,
    /// The last clock reading, and the VM exits since: logical time moved
    /// one step at each.
    clock_ns: u64,
    exits_since_clock: u64,
    error: Option<String>,
}

#[derive(Default)]
struct DiskAccesses {
    all: u64,
    reads: u64,
    /// A disk error is to be injected at the next access in the live part.
    error_due: bool,
    /// The access that failed (counted from 1).
    failed: Option<u64>,
}

impl ForkSeam {
    /// A fork replaying with `replayer`, logging to `writer` (made at the
    /// snapshot's time `start_ns`), live from `trigger` on, with a disk
    /// error due then if `disk_error`.
    pub fn new(
        replayer: Replayer,
        writer: EventLogWriter,
        start_ns: u64,
        trigger: Trigger,
        disk_error: bool,
        clock: LiveClock,
    ) -> Self {
        ForkSeam {
            replayer,
            trigger,
            clock,
            replayed: Mutex::new(Replayed {
                writer: Some(writer),
                clock_ns: start_ns,
                exits_since_clock: 0,
                error: None,
            }),
            live: OnceLock::new(),
            fork_event: OnceLock::new(),
            stop_at_fork: AtomicBool::new(false),
            disk: Mutex::new(DiskAccesses {
                error_due: disk_error,
                ..DiskAccesses::default()
            }),
        }
    }

    pub fn replayer(&self) -> &Replayer {
        &self.replayer
    }

    /// Whether the fork is live.
    pub fn is_live(&self) -> bool {
        self.live.get().is_some()
    }

    /// Goes live if the replay has reached the fork point; whether live.
    pub fn go_live_if_due(&self) -> bool {
        self.recorder().is_some()
    }

    /// The index of the fork's first live event, once live.
    pub fn fork_event(&self) -> Option<u64> {
        self.fork_event.get().copied()
    }

    /// Why the replayed part's log could not be written, if it could not:
    /// the VM stops then, which is the fork failing, not the replay.
    pub fn log_error(&self) -> Option<String> {
        self.replayed.lock().unwrap().error.clone()
    }

    /// The disk access that failed, if a disk error was injected.
    pub fn failed_disk_access(&self) -> Option<u64> {
        self.disk.lock().unwrap().failed
    }

    /// Writes the log's last chunk and hands the trace back.
    pub fn finish(&self) -> Result<(Option<SectionWriter>, LogTotals), FormatError> {
        match self.live.get() {
            Some(recorder) => recorder.finish(),
            None => {
                let writer = self.replayed.lock().unwrap().writer.take();
                writer.expect("a fork finishes once").finish()
            }
        }
    }

    /// The live part's recorder, if the fork is live (or due: then it goes
    /// live now).
    fn recorder(&self) -> Option<&Recorder> {
        if let Some(recorder) = self.live.get() {
            return Some(recorder);
        }
        match self.trigger {
            Trigger::Event(at) if self.replayer.position().events >= at => Some(self.go_live()),
            _ => None,
        }
    }

    fn go_live(&self) -> &Recorder {
        self.live.get_or_init(|| {
            let mut replayed = self.replayed.lock().unwrap();
            let writer = replayed.writer.take().expect("the fork goes live once");
            let now_ns = replayed.clock_ns + PINNED_EXIT_STEP_NS * replayed.exits_since_clock;
            let _ = self.fork_event.set(self.replayer.position().events);
            self.stop_at_fork.store(true, Ordering::Relaxed);
            Recorder::continuing(writer, self.clock.at(now_ns), &NO_HOST_REQUESTS)
        })
    }

    /// Hands a crossing to the recorder when live, else to the replayer,
    /// logging the `event` it replayed.
    fn cross(&self, call: impl FnOnce(&dyn Seam), event: impl FnOnce() -> Event) {
        match self.recorder() {
            Some(recorder) => call(recorder),
            None => {
                call(&self.replayer);
                self.log_event(event());
            }
        }
    }

    /// Logs a replayed event in the fork's log.
    fn log(&self, append: impl FnOnce(&mut EventLogWriter) -> Result<(), FormatError>) {
        let mut replayed = self.replayed.lock().unwrap();
        let Some(writer) = replayed.writer.as_mut() else {
            return;
        };
        if let Err(error) = append(writer) {
            replayed.error.get_or_insert(error.to_string());
        }
    }

    fn log_event(&self, event: Event) {
        {
            let mut replayed = self.replayed.lock().unwrap();
            match event {
                Event::Clock(ns) => {
                    replayed.clock_ns = ns;
                    replayed.exits_since_clock = 0;
                }
                _ if event.is_exit() => replayed.exits_since_clock += 1,
                _ => {}
            }
        }
        self.log(|writer| writer.append(&event));
    }
}

impl Clock for ForkSeam {
    fn monotonic_ns(&self) -> u64 {
        if let Some(recorder) = self.recorder() {
            return recorder.monotonic_ns();
        }
        let ns = self.replayer.monotonic_ns();
        self.log_event(Event::Clock(ns));
        ns
    }

    fn wall_ns(&self) -> u64 {
        if let Some(recorder) = self.recorder() {
            return recorder.wall_ns();
        }
        let ns = self.replayer.wall_ns();
        self.log_event(Event::Wall(ns));
        ns
    }
}

impl Seam for ForkSeam {
    fn delivery(&self) -> Delivery {
        // The fork goes on as the recording went.
        match self.recorder() {
            Some(_) => delivery::going_on_from(self.replayer.delivery()),
            None => self.replayer.delivery(),
        }
    }

    fn logged_stop(&self) -> Option<LoggedStop> {
        match self.recorder() {
            Some(_) => None,
            None => self.replayer.logged_stop(),
        }
    }

    fn wait_until(&self, ns: u64, limit: Instant) {
        if let Some(recorder) = self.recorder() {
            recorder.wait_until(ns, limit);
        }
    }

    fn exit(&self, exit: Exit<'_>, at: Place) {
        self.cross(|seam| seam.exit(exit, at), || exit_event(exit, at));
    }

    fn read_result(&self, data: &[u8]) {
        self.cross(
            |seam| seam.read_result(data),
            || Event::ReadResult(data.to_vec()),
        );
    }

    fn injected(&self, vector: u8) {
        self.cross(|seam| seam.injected(vector), || Event::Inject(vector));
    }

    /// Before the fork point the log's schedule, after it the recorder's
    /// (the default schedule from there on).
    fn schedule(&self, proposed: Option<usize>) -> Option<usize> {
        if let Some(recorder) = self.recorder() {
            return recorder.schedule(proposed);
        }
        let switched = self.replayer.schedule(proposed);
        if let Some(cpu) = switched {
            self.log_event(Event::Switch(cpu as u8));
        }
        switched
    }

    fn agent_input(&self, bytes: &[u8]) {
        self.cross(
            |seam| seam.agent_input(bytes),
            || Event::AgentInput(bytes.to_vec()),
        );
    }

    fn agent_output(&self, bytes: &[u8]) {
        self.cross(
            |seam| seam.agent_output(bytes),
            || Event::AgentOutput(bytes.to_vec()),
        );
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        match self.recorder() {
            Some(recorder) => recorder.disk_write(offset, data),
            None => {
                self.replayer.disk_write(offset, data);
                self.log(|writer| writer.append_disk_write(offset, data));
            }
        }
    }

    fn stop_reason(&self) -> Option<String> {
        if let Some(error) = self.log_error() {
            return Some(format!("cannot write the fork's trace: {error}"));
        }
        match self.recorder() {
            Some(_) if self.stop_at_fork.swap(false, Ordering::Relaxed) => {
                Some(AT_FORK_POINT.into())
            }
            Some(recorder) => recorder.stop_reason(),
            None => self.replayer.stop_reason(),
        }
    }

    fn memory_check_due(&self) -> bool {
        match self.recorder() {
            Some(recorder) => recorder.memory_check_due(),
            None => self.replayer.memory_check_due(),
        }
    }

    fn memory_checked(&self, digest: MemoryDigest) {
        let whole = digest.whole;
        self.cross(
            |seam| seam.memory_checked(digest),
            || Event::StateCheck { memory: whole },
        );
    }

    // A fork's own trace keeps no final check; a fork that never went live
    // replayed the recording to its power-off, and checks the recording's.
    fn final_check_due(&self) -> bool {
        self.recorder().is_none() && self.replayer.final_check_due()
    }

    fn final_state(&self, digest: &StateDigest) {
        if self.recorder().is_none() {
            self.replayer.final_state(digest);
        }
    }

    fn disk_access_fails(&self, write: bool) -> bool {
        let mut disk = self.disk.lock().unwrap();
        disk.all += 1;
        disk.reads += u64::from(!write);
        let read_trigger =
            matches!(self.trigger, Trigger::DiskRead(n) if !write && disk.reads == n);
        drop(disk);
        let live = if read_trigger {
            self.go_live();
            true
        } else {
            self.recorder().is_some()
        };
        // Replayed, a fork of a fork fails what its trace's fork failed.
        let fails = if live {
            std::mem::take(&mut self.disk.lock().unwrap().error_due)
        } else {
            self.replayer.disk_access_fails(write)
        };
        let mut disk = self.disk.lock().unwrap();
        if fails {
            disk.failed = Some(disk.all);
        }
        fails
    }
}
