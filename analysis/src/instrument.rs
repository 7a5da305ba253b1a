//! Runs analyses on a replay: sets the breakpoints the derived events need,
//! turns each debug stop into system calls and process changes, and hands
//! everything to every analysis in turn.
//!
//! Three hardware breakpoints on kernel code do it, so the fourth stays
//! free: `do_syscall_64` (a call's entry; its `pt_regs` hold the number and
//! arguments), `syscall_exit_to_user_mode` (its return, `pt_regs->ax`) and
//! `do_exit` (a task's end, whether by exit or by a signal). All three are
//! guest ring 0, which traps on PVM hosts too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use provm_seams::{EventTap, Position, StopHandler};
use provm_trace::events::Event;
use provm_vmm::guest_debug::{DebugStop, GuestDebug};
use provm_vmm::paging::Unmapped;
use provm_vmm::vm::{Vm, VmError};
use syscalls::x86_64::Sysno;

use crate::api::{Analysis, ProcessEvent};
use crate::guest::{Guest, Task};
use crate::profile::KernelInfo;
use crate::syscall::{Arg, Entered};

/// The index of each breakpoint in `GuestDebug::breakpoints`.
const SYSCALL_ENTRY: usize = 0;
const SYSCALL_RETURN: usize = 1;
const TASK_EXIT: usize = 2;
/// clone(2): the new task shares its parent's thread group.
const CLONE_THREAD: u64 = 0x10000;

type Analyses = Arc<Mutex<Vec<Box<dyn Analysis>>>>;

pub struct Instrument {
    kernel: KernelInfo,
    analyses: Analyses,
    /// Calls entered and not yet returned, by `task_struct` address.
    entered: HashMap<u64, Entered>,
    /// New processes announced (`ProcessEvent::Forked`) at one of their
    /// two sightings, their parent's return from the call and their own
    /// first return, and not yet seen at the other.
    half_seen_forks: HashSet<i32>,
    /// Debug stops seen.
    pub stops: u64,
    /// Stops at which the guest's structures could not be read.
    pub unreadable: u64,
}

impl Instrument {
    pub fn new(kernel: KernelInfo, analyses: Vec<Box<dyn Analysis>>) -> Self {
        Instrument {
            kernel,
            analyses: Arc::new(Mutex::new(analyses)),
            entered: HashMap::new(),
            half_seen_forks: HashSet::new(),
            stops: 0,
            unreadable: 0,
        }
    }

    /// The breakpoints to set on the replayed VM.
    pub fn guest_debug(&self) -> GuestDebug {
        let symbols = &self.kernel.symbols;
        let mut breakpoints = vec![0; 3];
        breakpoints[SYSCALL_ENTRY] = symbols.do_syscall_64;
        breakpoints[SYSCALL_RETURN] = symbols.syscall_exit_to_user_mode;
        breakpoints[TASK_EXIT] = symbols.do_exit;
        GuestDebug {
            breakpoints,
            single_step: false,
        }
    }

    /// Shows the analyses every log event (give it to `Replayer::set_tap`).
    pub fn event_tap(&self) -> Box<dyn EventTap> {
        Box::new(Tap(self.analyses.clone()))
    }

    /// The analyses, with what they found.
    pub fn into_analyses(self) -> Vec<Box<dyn Analysis>> {
        std::mem::take(&mut *self.analyses.lock().unwrap())
    }

    fn each(&self, mut call: impl FnMut(&mut dyn Analysis)) {
        for analysis in self.analyses.lock().unwrap().iter_mut() {
            call(analysis.as_mut());
        }
    }

    /// The `pt_regs` at `regs`: the call's number and six arguments.
    fn saved_call(&self, guest: &Guest, regs: u64) -> Result<(u64, [u64; 6]), Unmapped> {
        let o = &self.kernel.offsets;
        let mut raw = [0; 6];
        let places = [
            o.pt_regs_di,
            o.pt_regs_si,
            o.pt_regs_dx,
            o.pt_regs_r10,
            o.pt_regs_r8,
            o.pt_regs_r9,
        ];
        for (value, offset) in raw.iter_mut().zip(places) {
            *value = guest.read_u64(regs + offset)?;
        }
        Ok((guest.read_u64(regs + o.pt_regs_orig_ax)?, raw))
    }

    fn syscall_entry(&mut self, guest: &Guest, at: Position) -> Result<(), Unmapped> {
        let task_address = guest.current_task()?;
        let task = guest.task(task_address)?;
        let (number, raw) = self.saved_call(guest, guest.view.regs.rdi)?;
        let entered = Entered::decode(
            guest,
            task_address,
            task,
            number,
            raw,
            (at.events, at.guest_ns),
        );
        self.entered.insert(task_address, entered);
        Ok(())
    }

    fn syscall_return(&mut self, guest: &Guest, at: Position) -> Result<(), Unmapped> {
        let task_address = guest.current_task()?;
        let Some(entered) = self.entered.remove(&task_address) else {
            return self.first_return(guest, task_address, at);
        };
        let ret = guest.read_u64(guest.view.regs.rdi + self.kernel.offsets.pt_regs_ax)? as i64;
        let raw = entered.raw;
        let mut call = entered.returned(guest, ret, (at.events, at.guest_ns));
        // After an execve the task has its new name.
        call.task = guest.task(task_address)?;
        let mut forked = None;
        let derived = match Sysno::new(call.number as usize) {
            Some(Sysno::execve | Sysno::execveat) if ret == 0 => {
                let path = call.args.iter().find_map(|arg| match arg {
                    Arg::Path { absolute, .. } => Some(absolute.clone()),
                    _ => None,
                });
                let argv = call.args.iter().find_map(|arg| match arg {
                    Arg::Argv { values } => Some(values.clone()),
                    _ => None,
                });
                // The program as the kernel resolved it (symbolic links
                // followed), else as it was named.
                let exe = guest.exe_path(task_address).ok().flatten();
                Some(ProcessEvent::Executed {
                    task: call.task.clone(),
                    path: exe.or(path).unwrap_or_default(),
                    argv: argv.unwrap_or_default(),
                })
            }
            Some(call_number) if ret > 0 && made_process(guest, call_number, &raw)? => {
                forked = Some(ret as i32);
                None
            }
            _ => None,
        };
        self.each(|analysis| analysis.syscall(&call));
        if let Some(event) = derived {
            self.each(|analysis| analysis.process(&event, at));
        }
        if let Some(child) = forked {
            self.forked(call.task, child, at);
        }
        Ok(())
    }

    /// A return to user space with no call entered: a call entered before
    /// the breakpoints were set, or a new task's first return (from the
    /// fork, which has no entry). The scheduler may run a new process
    /// before its parent returns from the call (vfork always does), so
    /// its exec and exit can come before the parent's return: it is
    /// announced here if it comes first.
    fn first_return(
        &mut self,
        guest: &Guest,
        task_address: u64,
        at: Position,
    ) -> Result<(), Unmapped> {
        let o = &self.kernel.offsets;
        let regs = guest.view.regs.rdi;
        let number = guest.read_u64(regs + o.pt_regs_orig_ax)?;
        let ret = guest.read_u64(regs + o.pt_regs_ax)?;
        let forking = matches!(
            Sysno::new(number as usize),
            Some(Sysno::fork | Sysno::vfork | Sysno::clone | Sysno::clone3)
        );
        if !forking || ret != 0 {
            return Ok(());
        }
        let task = guest.task(task_address)?;
        // A new thread's first return looks the same, but it is no process.
        if task.pid == task.tid {
            let parent = guest.task(guest.parent(task_address)?)?;
            self.forked(parent, task.pid, at);
        }
        Ok(())
    }

    /// Announces that `parent` made the process `child`, once: at the
    /// first of its two sightings. (A process killed before its first
    /// return leaves its pid here; only that pid's reuse, after the whole
    /// pid space has gone round, could then go unannounced.)
    fn forked(&mut self, parent: Task, child: i32, at: Position) {
        if self.half_seen_forks.remove(&child) {
            return;
        }
        self.half_seen_forks.insert(child);
        let event = ProcessEvent::Forked { parent, child };
        self.each(|analysis| analysis.process(&event, at));
    }

    fn task_exit(&mut self, guest: &Guest, at: Position) -> Result<(), Unmapped> {
        let task_address = guest.current_task()?;
        let task = guest.task(task_address)?;
        if let Some(entered) = self.entered.remove(&task_address) {
            let call = entered.never_returned((at.events, at.guest_ns));
            self.each(|analysis| analysis.syscall(&call));
        }
        let event = ProcessEvent::Exited {
            task,
            status: guest.view.regs.rdi as i64,
        };
        self.each(|analysis| analysis.process(&event, at));
        Ok(())
    }
}

/// Whether a successful `call` made a new process, not a thread.
fn made_process(guest: &Guest, call: Sysno, raw: &[u64; 6]) -> Result<bool, Unmapped> {
    Ok(match call {
        Sysno::fork | Sysno::vfork => true,
        Sysno::clone => raw[0] & CLONE_THREAD == 0,
        // clone3's first argument points at struct clone_args, flags first.
        Sysno::clone3 => guest.read_u64(raw[0])? & CLONE_THREAD == 0,
        _ => false,
    })
}

impl StopHandler for Instrument {
    fn stopped(&mut self, vm: &mut Vm, stop: DebugStop, at: Position) -> Result<(), VmError> {
        self.stops += 1;
        let view = vm.view()?;
        let kernel = self.kernel.clone();
        let guest = Guest::new(&view, &kernel);
        self.each(|analysis| analysis.stop(&guest, at));
        let read = match stop {
            DebugStop::Breakpoint {
                index: SYSCALL_ENTRY,
                ..
            } => self.syscall_entry(&guest, at),
            DebugStop::Breakpoint {
                index: SYSCALL_RETURN,
                ..
            } => self.syscall_return(&guest, at),
            DebugStop::Breakpoint {
                index: TASK_EXIT, ..
            } => self.task_exit(&guest, at),
            _ => Ok(()),
        };
        self.unreadable += u64::from(read.is_err());
        Ok(())
    }
}

/// Forwards log events to the analyses.
struct Tap(Analyses);

impl EventTap for Tap {
    fn event(&mut self, index: u64, event: &Event) {
        for analysis in self.0.lock().unwrap().iter_mut() {
            analysis.event(index, event);
        }
    }
}
