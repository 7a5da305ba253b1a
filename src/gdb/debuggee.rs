//! The replay as a debugger drives it: forward to a breakpoint, a step or
//! a log event, and back in time by restoring the nearest earlier snapshot
//! and re-executing (QEMU's reverse-debugging model, at KVM speed).
//!
//! A snapshot of the replay is three things taken together at a pause
//! after a VM exit: the VM (`Vm::snapshot_at`, encoded as a trace encodes
//! its snapshot: the non-zero pages, zstd-compressed), the replayer's
//! place in the log (`Checkpoint`), and a mark in the disk's journal.
//! Restoring all three puts the replay back exactly there: it goes on
//! making the recorded exits and still ends "replay matched".

use std::sync::Arc;
use std::time::Instant;

use provm_analysis::guest::{Guest, SavedRegs, Task};
use provm_analysis::KernelInfo;
use provm_replayer::{Checkpoint, Position, ReplayEnd, Replayer, Stopped};
use provm_vmm::guest_debug::{DebugStop, GuestDebug, HW_BREAKPOINTS};
use provm_vmm::paging::Unmapped;
use provm_vmm::vm::{GuestView, Vm, VmConfig, VmError};

use super::disk_journal::{DiskJournal, Mark};
use super::snapshots::Snapshots;
use crate::disk::overlay::{self, OverlayLocation};
use crate::replay::{Opened, ReplayError, ReplayOptions, ReplayReport};
use crate::snapshot;

/// How often the replay pauses (in log events) to let the debugger
/// interrupt it (gdb's Ctrl-C) or hear of its progress: a fraction of a
/// second on the development hosts, and a pause costs next to nothing.
const POLL_EVENTS: u64 = 200;

/// Where the replay stands, finer than a log event: several breakpoint
/// hits can come between two VM exits. Ordered by time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Point {
    /// Log events consumed.
    pub event: u64,
    /// Among the stops at `event`: 2n at its nth breakpoint hit, 2n+1
    /// after it (a step), `u64::MAX` at the pause after a VM exit (a
    /// snapshot's place: hits at `event` come before it, the next exit's
    /// clock reading comes first after it).
    rank: u64,
}

impl Point {
    fn at_exit(event: u64) -> Point {
        Point {
            event,
            rank: u64::MAX,
        }
    }
}

/// Why the replay stopped for the debugger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Halt {
    Breakpoint,
    Step,
    /// At the log event asked for (the first VM exit at or after it).
    Event,
    /// The replay is over (see `Debuggee::report`).
    Ended,
    /// The debugger interrupted it.
    Interrupted,
    /// Going back reached the start of the replay.
    Beginning,
}

#[derive(Debug, thiserror::Error)]
pub enum DebugError {
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("cannot read the trace: {0}")]
    Trace(#[from] provm_trace::format::FormatError),
    #[error("cannot restore a time-travel snapshot: {0}")]
    Snapshot(#[from] provm_trace::snapshot::SnapshotError),
    #[error("cannot rewind the guest's disk: {0}")]
    Disk(#[from] std::io::Error),
    #[error("the log has {events} events; event {asked} is past its end")]
    PastTheEnd { asked: u64, events: u64 },
}

/// One time-travel snapshot.
struct Saved {
    replay: Checkpoint,
    vm: Vec<u8>,
    disk: Mark,
}

/// What time-travel snapshots have cost so far.
#[derive(Clone, Debug, Default)]
pub struct SnapshotCost {
    /// Each snapshot taken: its encoded size in bytes and the seconds it
    /// took (capture and compression).
    pub taken: Vec<(usize, f64)>,
}

impl SnapshotCost {
    /// The bytes and seconds of all of them.
    pub fn totals(&self) -> (usize, f64) {
        self.taken
            .iter()
            .fold((0, 0.0), |(bytes, seconds), (b, s)| {
                (bytes + b, seconds + s)
            })
    }
}

/// What `monitor where` shows.
pub struct Whereabouts {
    pub position: Position,
    /// The replay's start, in guest nanoseconds.
    pub start_ns: u64,
    pub task: Result<Task, Unmapped>,
    pub user_regs: Result<SavedRegs, Unmapped>,
}

pub struct Debuggee {
    opened: Opened,
    options: ReplayOptions,
    vm: Vm,
    replayer: Arc<Replayer>,
    disk: DiskJournal,
    snapshots: Snapshots<Saved>,
    pub cost: SnapshotCost,
    pub kernel: KernelInfo,
    /// The hardware breakpoints gdb set (guest virtual addresses).
    pub breakpoints: Vec<u64>,
    here: Point,
    /// The replay's end, once it got there (until it goes back).
    end: Option<ReplayEnd>,
    /// The log's length in events.
    pub log_events: u64,
}

impl Debuggee {
    /// The trace `options` names, restored at its start, taking a snapshot
    /// every `every` events and keeping at most `limit`.
    pub fn new(options: ReplayOptions, every: u64, limit: usize) -> Result<Self, DebugError> {
        let (opened, start) = Opened::open(&options)?;
        let trace = &opened.trace;
        let kernel =
            KernelInfo::load(&trace.kernel()?, &trace.kernel_profile).map_err(ReplayError::from)?;
        let log_events = trace.outcome.events;
        let disk = DiskJournal::new(Box::new(
            overlay::create(&opened.base, OverlayLocation::temporary())
                .map_err(ReplayError::from)?,
        ));
        let replayer = Arc::new(opened.replayer()?);
        let first = Saved {
            replay: replayer.checkpoint(),
            vm: trace.snapshot.clone(),
            disk: disk.mark(),
        };
        let config = vm_config(&opened, &options, &disk, &replayer);
        let vm = Vm::restore(config, start)?;
        Ok(Debuggee {
            snapshots: Snapshots::new(every, limit, 0, first),
            opened,
            options,
            vm,
            replayer,
            disk,
            cost: SnapshotCost::default(),
            kernel,
            breakpoints: Vec::new(),
            here: Point::at_exit(0),
            end: None,
            log_events,
        })
    }

    pub fn position(&self) -> Position {
        self.replayer.position()
    }

    /// The snapshot interval now, and how many snapshots are kept.
    pub fn snapshot_interval(&self) -> (u64, usize) {
        (self.snapshots.every(), self.snapshots.len())
    }

    /// How the replay ended, once it has.
    pub fn report(&self) -> Option<ReplayReport> {
        self.end.clone().map(|end| self.opened.report(end))
    }

    /// Where the replay is and which process runs.
    pub fn whereabouts(&self) -> Result<Whereabouts, DebugError> {
        let view = self.vm.view()?;
        let guest = Guest::new(&view, &self.kernel);
        Ok(Whereabouts {
            position: self.position(),
            start_ns: self.opened.start_ns,
            task: guest.current_task().and_then(|task| guest.task(task)),
            user_regs: guest.saved_user_regs(),
        })
    }

    /// The guest as it stands, to read registers and memory.
    pub fn view(&self) -> Result<GuestView<'_>, DebugError> {
        Ok(self.vm.view()?)
    }

    /// Adds a hardware breakpoint; false if all four are in use.
    pub fn add_breakpoint(&mut self, address: u64) -> bool {
        if self.breakpoints.len() == HW_BREAKPOINTS {
            return false;
        }
        self.breakpoints.push(address);
        true
    }

    pub fn remove_breakpoint(&mut self, address: u64) -> bool {
        let before = self.breakpoints.len();
        self.breakpoints.retain(|&at| at != address);
        self.breakpoints.len() != before
    }

    /// Runs forward to the next breakpoint hit, or the end.
    pub fn resume(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Result<Halt, DebugError> {
        self.advance(true, false, None, interrupted)
    }

    /// Runs one instruction (where the platform traps it: on PVM hosts
    /// only guest ring 0 does, and a step from user code stops at the next
    /// kernel instruction).
    pub fn step(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Result<Halt, DebugError> {
        self.advance(true, true, None, interrupted)
    }

    /// Goes to log event `event` (the first VM exit at or after it),
    /// forward or back, ignoring breakpoints on the way; tells `progress`
    /// the event reached at each pause.
    pub fn go_to_event(
        &mut self,
        event: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Halt, DebugError> {
        if event > self.log_events {
            return Err(DebugError::PastTheEnd {
                asked: event,
                events: self.log_events,
            });
        }
        if event < self.here.event || self.end.is_some() {
            let (at, _) = self
                .snapshots
                .at_or_before(event)
                .expect("the first snapshot is at the replay's start");
            self.restore(at)?;
        }
        let replayer = self.replayer.clone();
        let mut report = || {
            progress(replayer.position().events);
            false
        };
        self.advance(false, false, Some(event), &mut report)
    }

    /// Goes back to the last breakpoint hit before this point: re-executes
    /// from the nearest earlier snapshot to here noting the hits, then
    /// restores it again and runs to the last of them. With none there,
    /// tries the snapshot before, back to the start of the replay.
    pub fn reverse_continue(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Halt, DebugError> {
        let mut upto = self.here;
        loop {
            let Some((at, _)) = self.snapshots.before(upto.event) else {
                self.restore(0)?;
                return Ok(Halt::Beginning);
            };
            self.restore(at)?;
            let mut last = None;
            loop {
                match self.advance(true, false, Some(upto.event + 1), interrupted)? {
                    Halt::Breakpoint if self.here < upto => last = Some(self.here),
                    Halt::Interrupted => return Ok(Halt::Interrupted),
                    _ => break,
                }
            }
            if let Some(hit) = last {
                self.restore(at)?;
                while self.here != hit {
                    match self.advance(true, false, None, interrupted)? {
                        Halt::Breakpoint => {}
                        other => return Ok(other),
                    }
                }
                return Ok(Halt::Breakpoint);
            }
            upto = Point::at_exit(at);
        }
    }

    /// Runs the replay forward until a breakpoint hit (if `breakpoints`),
    /// a step (if `single_step`), the exit at or after `until_event`, the
    /// end, or the debugger's interruption; takes the snapshots that fall
    /// due on the way.
    fn advance(
        &mut self,
        breakpoints: bool,
        single_step: bool,
        until_event: Option<u64>,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Halt, DebugError> {
        if self.end.is_some() {
            return Ok(Halt::Ended);
        }
        let debug = GuestDebug {
            breakpoints: if breakpoints {
                self.breakpoints.clone()
            } else {
                Vec::new()
            },
            single_step,
        };
        loop {
            let position = self.position().events;
            let pause = [
                Some(self.snapshots.next_due()),
                until_event,
                Some(position + POLL_EVENTS),
            ];
            self.replayer.pause_at(pause.into_iter().flatten().min());
            self.vm.set_guest_debug(&debug)?;
            self.replayer.resumed();
            let deadline = Instant::now() + self.options.timeout;
            match self.replayer.run_to_stop(&mut self.vm, deadline)? {
                Stopped::Debug(stop) => {
                    self.here = self.after_stop(stop);
                    return Ok(match stop {
                        DebugStop::Breakpoint { .. } => Halt::Breakpoint,
                        DebugStop::Step { .. } => Halt::Step,
                    });
                }
                Stopped::Paused => {
                    let event = self.position().events;
                    self.here = Point::at_exit(event);
                    if event >= self.snapshots.next_due() {
                        self.take_snapshot()?;
                    }
                    if until_event.is_some_and(|until| event >= until) {
                        return Ok(Halt::Event);
                    }
                    if interrupted() {
                        return Ok(Halt::Interrupted);
                    }
                }
                Stopped::Ended(end) => {
                    self.here = Point::at_exit(self.position().events);
                    self.end = Some(end);
                    return Ok(Halt::Ended);
                }
            }
        }
    }

    /// The point a debug stop puts the replay at.
    fn after_stop(&self, stop: DebugStop) -> Point {
        let event = self.position().events;
        // Breakpoint hits at this event so far, this one included.
        let hits = match self.here {
            Point { event: e, rank } if e == event && rank != u64::MAX => rank / 2,
            _ => 0,
        };
        let rank = match stop {
            DebugStop::Breakpoint { .. } => 2 * (hits + 1),
            DebugStop::Step { .. } => 2 * hits + 1,
        };
        Point { event, rank }
    }

    fn take_snapshot(&mut self) -> Result<(), DebugError> {
        let started = Instant::now();
        // No breakpoint or step may fire while the last exit completes.
        self.vm.set_guest_debug(&GuestDebug::default())?;
        let position = self.position();
        let vm = snapshot::encode(&self.vm.snapshot_at(position.guest_ns)?);
        self.cost
            .taken
            .push((vm.len(), started.elapsed().as_secs_f64()));
        let saved = Saved {
            replay: self.replayer.checkpoint(),
            vm,
            disk: self.disk.mark(),
        };
        self.snapshots.add(position.events, saved);
        Ok(())
    }

    /// Puts the whole replay back at the snapshot taken at event `at`.
    fn restore(&mut self, at: u64) -> Result<(), DebugError> {
        let (_, saved) = self
            .snapshots
            .at_or_before(at)
            .expect("the first snapshot is at the replay's start");
        let memory_mib = self.opened.trace.manifest.memory_mib;
        let vm = snapshot::decode(&saved.vm, memory_mib)?;
        self.disk.rewind(saved.disk)?;
        self.replayer
            .rewind(&saved.replay, self.opened.trace.events()?)?;
        let event = saved.replay.position().events;
        let config = vm_config(&self.opened, &self.options, &self.disk, &self.replayer);
        self.vm = Vm::restore(config, vm)?;
        self.here = Point::at_exit(event);
        self.end = None;
        Ok(())
    }

    /// Runs the replay to its end without stopping (gdb went away).
    pub fn finish(&mut self) -> Result<ReplayReport, DebugError> {
        self.breakpoints.clear();
        while self.advance(false, false, None, &mut || false)? != Halt::Ended {}
        Ok(self.report().expect("the replay ended"))
    }
}

/// The machine of a replay, on the journaled disk.
fn vm_config(
    opened: &Opened,
    options: &ReplayOptions,
    disk: &DiskJournal,
    replayer: &Arc<Replayer>,
) -> VmConfig {
    VmConfig {
        memory_mib: opened.trace.manifest.memory_mib,
        disk: disk.disk(),
        echo_console: options.echo_console,
        seam: replayer.clone(),
        exitless_limit: None,
    }
}
