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

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use provm_analysis::guest::{Guest, SavedRegs, Task};
use provm_analysis::KernelInfo;
use provm_seams::{Checkpoint, Position, ReplayEnd, Replayer, Stopped};
use provm_vmm::guest_debug::{DebugStop, GuestDebug, HW_BREAKPOINTS};
use provm_vmm::paging::Unmapped;
use provm_vmm::vm::{GuestView, Vm, VmError, VmSnapshot};

use super::disk_journal::{DiskJournal, Mark};
use super::snapshots::Snapshots;
use provm_engine::disk::overlay::{self, OverlayLocation};
use provm_engine::machine::{GuestDisk, Machine, MachineError};
use provm_engine::replay::{Opened, ReplayError, ReplayOptions, ReplayReport};
use provm_engine::snapshot;

/// How often the replay pauses (in log events) to let the debugger
/// interrupt it (gdb's Ctrl-C) or hear of its progress: a fraction of a
/// second on the development hosts, and a pause costs next to nothing.
const POLL_EVENTS: u64 = 200;

/// How many times a reverse step re-executes to the instruction before
/// this one before it gives up, where a re-execution lands elsewhere than
/// the one that counted the steps to it. Seen once in many runs on the SVM
/// test bed (QEMU's TCG under Linux 6.12): the step back from a breakpoint
/// hit landed on the hit; a host that steps the same way every time needs
/// one.
const REEXECUTIONS: u32 = 3;

/// Where the replay stands, finer than a log event. Between two VM exits
/// the guest runs without touching the log; a point there is counted from
/// the pause after the first of them: breakpoint hits, then single steps.
/// Ordered by time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Point {
    /// Log events consumed at the pause after the last VM exit
    /// (`Replayer::pause_place`).
    pub event: u64,
    /// Breakpoint hits since that pause; a single step that lands on a
    /// breakpoint's address counts as its hit, as continuing would have
    /// stopped there, so a point reads the same however it was reached.
    hits: u64,
    /// Single steps since the last of those hits (or since the pause).
    steps: u64,
}

impl Point {
    /// The pause after a VM exit, at log event `event`.
    fn at_exit(event: u64) -> Point {
        Point {
            event,
            hits: 0,
            steps: 0,
        }
    }

    fn is_pause(&self) -> bool {
        self.hits == 0 && self.steps == 0
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
    #[error(
        "going back one instruction: re-executing to it ({target:?}, rip {rip:#x}) landed at \
         {landed:?}, rip {landed_rip:#x}, in each of {REEXECUTIONS} attempts: this host does \
         not single-step the guest the same way each time"
    )]
    NotReachedAgain {
        target: Point,
        rip: u64,
        landed: Point,
        landed_rip: u64,
    },
    #[error("the log has {events} events; event {asked} is past its end")]
    PastTheEnd { asked: u64, events: u64 },
    #[error(
        "going back one instruction: single-stepping from the last VM exit did not come \
         back to rip {rip:#x} (breakpoint hit {hits} after log event {event}); it ended at \
         rip {ended_rip:#x}, {ended:?}"
    )]
    NotFoundAgain {
        event: u64,
        hits: u64,
        rip: u64,
        ended: Point,
        ended_rip: u64,
    },
}

/// A VM the trace's machine could not restore is the debugger failing (a
/// time-travel snapshot it took); an image it could not open, the replay.
impl From<MachineError> for DebugError {
    fn from(error: MachineError) -> Self {
        match error {
            MachineError::Vm(error) => DebugError::Vm(error),
            MachineError::Image(error) => DebugError::Replay(ReplayError::Image(error)),
        }
    }
}

/// One time-travel snapshot.
struct Saved {
    replay: Checkpoint,
    vm: Vec<u8>,
    disk: Mark,
    /// Taken mid-replay, so a restore resumes as the saved VM would have
    /// (`Vm::resume_as_saved`). The trace's own snapshot is restored as
    /// the recording and the replay restored it, without: resuming it so
    /// let an interrupt waiting there (a tick's IPI on a second vCPU) in
    /// at the first exit, where the recording held it.
    mid_run: bool,
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
        let kernel = opened.kernel_info()?;
        let log_events = trace.outcome.events;
        let disk = DiskJournal::new(Box::new(
            overlay::create(&opened.base, OverlayLocation::temporary())
                .map_err(ReplayError::from)?,
        ));
        let replayer = Arc::new(opened.replayer()?);
        replayer.skip_register_check();
        let first = Saved {
            replay: replayer.checkpoint(),
            vm: trace.snapshot.clone(),
            disk: disk.mark(),
            mid_run: false,
        };
        let vm = restored_vm(&opened, &options, &disk, &replayer, start)?;
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
        self.end.clone().map(|end| self.opened.report(end, None))
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

    /// The guest as vCPU `vcpu` sees it (running or parked), to read
    /// registers and memory.
    pub fn view_of(&self, vcpu: usize) -> Result<GuestView<'_>, DebugError> {
        Ok(self.vm.view_of(vcpu)?)
    }

    /// The vCPU that runs, and how many there are.
    pub fn vcpus(&self) -> (usize, usize) {
        (self.vm.running_vcpu(), self.vm.vcpu_count())
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
        if Point::at_exit(event) < self.here || self.end.is_some() {
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
            let Some(at) = self.snapshot_before(upto) else {
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

    /// Goes back one instruction, to the point a single step before this
    /// one, by re-executing to it. Only the stretch since the last VM exit
    /// is single-stepped (see `instruction_before`); after some steps, not
    /// even that: it runs to their start and steps one fewer.
    ///
    /// Where it counted the steps, the re-execution must land where the
    /// count stood: at the same point, at the same RIP. Where it does not
    /// (the host stepped differently from one re-execution to the next),
    /// both are made again, `REEXECUTIONS` times at most, and then the step
    /// fails rather than show the debugger another instruction.
    pub fn reverse_step(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Halt, DebugError> {
        let here = self.here;
        if here.steps > 0 {
            let target = Point {
                steps: here.steps - 1,
                ..here
            };
            tracing::debug!(?here, ?target, "reverse step");
            return Ok(match self.go_to(target, interrupted)? {
                ControlFlow::Continue(()) => Halt::Step,
                ControlFlow::Break(halt) => halt,
            });
        }
        let mut attempt = 1;
        loop {
            let (target, rip) = match self.instruction_before(here, interrupted)? {
                ControlFlow::Continue(Some(before)) => before,
                ControlFlow::Continue(None) => {
                    self.restore(0)?;
                    return Ok(Halt::Beginning);
                }
                ControlFlow::Break(halt) => return Ok(halt),
            };
            tracing::debug!(?here, ?target, attempt, "reverse step");
            match self.go_to(target, interrupted)? {
                ControlFlow::Continue(()) if self.vm.rip() == rip => return Ok(Halt::Step),
                // Elsewhere: at the point, not at the instruction; past
                // it, within its stretch; at the exit after it (a step ran
                // on past its breakpoints).
                ControlFlow::Continue(())
                | ControlFlow::Break(Halt::Step | Halt::Breakpoint | Halt::Event) => {}
                ControlFlow::Break(halt) => return Ok(halt),
            }
            let (landed, landed_rip) = (self.here, self.vm.rip());
            tracing::warn!(
                "going back one instruction: re-executing to {target:?} (rip {rip:#x}) landed at \
                 {landed:?}, rip {landed_rip:#x}; this host stepped differently from one \
                 re-execution to the next (attempt {attempt} of {REEXECUTIONS})"
            );
            if attempt == REEXECUTIONS {
                return Err(DebugError::NotReachedAgain {
                    target,
                    rip,
                    landed,
                    landed_rip,
                });
            }
            attempt += 1;
        }
    }

    /// The point one instruction before `here`, a breakpoint hit or the
    /// pause after a VM exit, and the RIP there: counted by single-stepping
    /// from the pause that begins its stretch, or for a pause, the stretch
    /// before it. `None` at the replay's start.
    fn instruction_before(
        &mut self,
        here: Point,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<ControlFlow<Halt, Option<(Point, u64)>>, DebugError> {
        if !here.is_pause() {
            let rip = self.vm.rip();
            if let ControlFlow::Break(halt) = self.go_to(Point::at_exit(here.event), interrupted)? {
                return Ok(ControlFlow::Break(halt));
            }
            let before = match self.step_while(
                |point| point.event == here.event && point < here,
                interrupted,
            )? {
                ControlFlow::Continue(before) => before,
                ControlFlow::Break(halt) => return Ok(ControlFlow::Break(halt)),
            };
            // Steps count hits as continuing does (see `Point::hits`) unless
            // the breakpoints changed since, or the platform differs.
            if self.here != here || self.vm.rip() != rip {
                return Err(DebugError::NotFoundAgain {
                    event: here.event,
                    hits: here.hits,
                    rip,
                    ended: self.here,
                    ended_rip: self.vm.rip(),
                });
            }
            return Ok(ControlFlow::Continue(Some(before)));
        }
        // The instruction before a pause is the one that exited: the last
        // point of the stretch before.
        let start = match self.pause_before(here.event, interrupted)? {
            ControlFlow::Continue(Some(start)) => start,
            ControlFlow::Continue(None) => return Ok(ControlFlow::Continue(None)),
            ControlFlow::Break(halt) => return Ok(ControlFlow::Break(halt)),
        };
        if let ControlFlow::Break(halt) = self.go_to(Point::at_exit(start), interrupted)? {
            return Ok(ControlFlow::Break(halt));
        }
        Ok(
            match self.step_while(|point| point.event == start, interrupted)? {
                ControlFlow::Continue(last) => ControlFlow::Continue(Some(last)),
                ControlFlow::Break(halt) => ControlFlow::Break(halt),
            },
        )
    }

    /// Single-steps, as `stepi` does, while `more` holds where the replay
    /// stands; returns the last point at which it held, and the RIP there.
    /// Breakpoints stay armed: a step can run more than one instruction
    /// (over a fault, its handler; with the trap flag, a SYSCALL whose FMASK
    /// clears it), and must stop where continuing would have stopped too.
    fn step_while(
        &mut self,
        more: impl Fn(Point) -> bool,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<ControlFlow<Halt, (Point, u64)>, DebugError> {
        let mut last = (self.here, self.vm.rip());
        while more(self.here) {
            last = (self.here, self.vm.rip());
            match self.advance(true, true, None, interrupted)? {
                Halt::Step | Halt::Breakpoint => {}
                halt => return Ok(ControlFlow::Break(halt)),
            }
        }
        Ok(ControlFlow::Continue(last))
    }

    /// The pause before the one at log event `end`, found by re-executing
    /// from the snapshot before it, pausing at every VM exit; `None` if
    /// `end` is the replay's start.
    fn pause_before(
        &mut self,
        end: u64,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<ControlFlow<Halt, Option<u64>>, DebugError> {
        let Some((at, _)) = self.snapshots.before(end) else {
            return Ok(ControlFlow::Continue(None));
        };
        self.restore(at)?;
        let mut last = at;
        loop {
            match self.advance(false, false, Some(self.here.event + 1), interrupted)? {
                Halt::Event if self.here.event < end => last = self.here.event,
                Halt::Event => return Ok(ControlFlow::Continue(Some(last))),
                halt => return Ok(ControlFlow::Break(halt)),
            }
        }
    }

    /// Re-executes to `target`: restores the nearest snapshot at or before
    /// its pause, runs to the pause, continues to its breakpoint hit and
    /// single-steps the rest. Stops early where the re-execution does not
    /// reach it (the breakpoints changed since), at the next VM exit.
    fn go_to(
        &mut self,
        target: Point,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<ControlFlow<Halt>, DebugError> {
        let (at, _) = self
            .snapshots
            .at_or_before(target.event)
            .expect("the first snapshot is at the replay's start");
        self.restore(at)?;
        let mut halt = self.advance(false, false, Some(target.event), interrupted)?;
        loop {
            match halt {
                Halt::Event | Halt::Breakpoint | Halt::Step if self.here < target => {}
                Halt::Event | Halt::Breakpoint | Halt::Step if self.here == target => {
                    return Ok(ControlFlow::Continue(()))
                }
                halt => return Ok(ControlFlow::Break(halt)),
            }
            let step = self.here.hits == target.hits;
            halt = self.advance(true, step, Some(target.event + 1), interrupted)?;
        }
    }

    /// The newest snapshot taken before `point`.
    fn snapshot_before(&self, point: Point) -> Option<u64> {
        let found = if point.is_pause() {
            self.snapshots.before(point.event)
        } else {
            self.snapshots.at_or_before(point.event)
        };
        found.map(|(at, _)| at)
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
                    tracing::trace!(?stop, here = ?self.here, "debug stop");
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
        let event = self.replayer.pause_place();
        let since = if self.here.event == event {
            self.here
        } else {
            Point::at_exit(event)
        };
        if stop.at_breakpoint(&self.breakpoints) {
            Point {
                event,
                hits: since.hits + 1,
                steps: 0,
            }
        } else {
            Point {
                steps: since.steps + 1,
                ..since
            }
        }
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
            mid_run: true,
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
        let manifest = &self.opened.trace.manifest;
        let vm = snapshot::decode(&saved.vm, manifest.memory_mib, manifest.machine_version)?;
        self.disk.rewind(saved.disk)?;
        self.replayer
            .rewind(&saved.replay, self.opened.trace.events()?)?;
        let event = saved.replay.position().events;
        self.vm = restored_vm(&self.opened, &self.options, &self.disk, &self.replayer, vm)?;
        if saved.mid_run {
            self.vm.resume_as_saved();
        }
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

/// The replay's VM restored from `snapshot` into the trace's machine,
/// on the journaled disk, driven by the replayer (rewound to match).
fn restored_vm(
    opened: &Opened,
    options: &ReplayOptions,
    disk: &DiskJournal,
    replayer: &Arc<Replayer>,
    snapshot: VmSnapshot,
) -> Result<Vm, DebugError> {
    let machine = Machine {
        disk: GuestDisk::Given(disk.disk()),
        ..opened.machine(options.echo_console)
    };
    Ok(machine.restore_with(snapshot, replayer.clone())?)
}
