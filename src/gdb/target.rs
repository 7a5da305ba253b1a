//! The replayed guest as a gdbstub target: x86-64 registers, guest virtual
//! memory through the guest's page tables, hardware breakpoints, continue,
//! single-step, reverse-continue, reverse single-step and monitor commands. A replay cannot be
//! changed, so writes to registers or memory are refused (and with them
//! gdb's software breakpoints: use `hbreak`).
//!
//! Each vCPU is a gdb thread, vCPU n thread n + 1 (gdb's ids start at 1);
//! a stop names the running vCPU, and a parked one's registers and memory
//! read as it left them. provm runs one vCPU at a time, in the log's
//! order, so a resume is the whole machine's, whichever thread gdb names:
//! a step steps the running vCPU.

use std::time::{Duration, Instant};

use gdbstub::common::{Signal, Tid};
use gdbstub::stub::MultiThreadStopReason;
use gdbstub::target::ext::base::multithread::{
    MultiThreadBase, MultiThreadResume, MultiThreadResumeOps, MultiThreadSchedulerLocking,
    MultiThreadSchedulerLockingOps, MultiThreadSingleStep, MultiThreadSingleStepOps,
};
use gdbstub::target::ext::base::reverse_exec::{
    ReplayLogPosition, ReverseCont, ReverseContOps, ReverseStep, ReverseStepOps,
};
use gdbstub::target::ext::base::BaseOps;
use gdbstub::target::ext::breakpoints::{
    Breakpoints, BreakpointsOps, HwBreakpoint, HwBreakpointOps,
};
use gdbstub::target::ext::monitor_cmd::{ConsoleOutput, MonitorCmd, MonitorCmdOps};
use gdbstub::target::{Target, TargetError, TargetResult};
use gdbstub_arch::x86::reg::X86_64CoreRegs;
use gdbstub_arch::x86::X86_64_SSE;

use super::debuggee::{DebugError, Debuggee, Halt};
use super::monitor;
use provm_vmm::vm::GuestView;

/// How often a long monitor command tells gdb it is still running.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// EFAULT, gdb's "cannot access memory".
const EFAULT: u8 = 14;

/// What gdb asked the replay to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    Continue,
    Step,
    ReverseContinue,
    ReverseStep,
}

pub struct ReplayTarget {
    pub debuggee: Debuggee,
    pub resume: Resume,
}

impl ReplayTarget {
    /// Carries out the last resume request; `interrupted` says whether gdb
    /// sent something (Ctrl-C) meanwhile.
    pub fn run(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Option<MultiThreadStopReason<u64>>, DebugError> {
        let halt = match self.resume {
            Resume::Continue => self.debuggee.resume(interrupted)?,
            Resume::Step => self.debuggee.step(interrupted)?,
            Resume::ReverseContinue => self.debuggee.reverse_continue(interrupted)?,
            Resume::ReverseStep => self.debuggee.reverse_step(interrupted)?,
        };
        let tid = self.running_thread();
        Ok(match halt {
            Halt::Breakpoint => Some(MultiThreadStopReason::HwBreak(tid)),
            // With the thread, so that gdb switches to the vCPU that ran.
            Halt::Step | Halt::Event => Some(self.stopped(Signal::SIGTRAP)),
            // The end of the replay is the end of the replay log: gdb stays
            // connected and may go back from there.
            Halt::Ended => {
                if let Some(report) = self.debuggee.report() {
                    eprintln!("provm: the replay reached its end: {}", report.summary());
                }
                Some(MultiThreadStopReason::ReplayLog {
                    tid: Some(tid),
                    pos: ReplayLogPosition::End,
                })
            }
            Halt::Beginning => Some(MultiThreadStopReason::ReplayLog {
                tid: Some(tid),
                pos: ReplayLogPosition::Begin,
            }),
            // gdb's bytes are waiting: the event loop reads them.
            Halt::Interrupted => None,
        })
    }

    /// A stop by `signal`, on the running vCPU's thread.
    pub fn stopped(&self, signal: Signal) -> MultiThreadStopReason<u64> {
        MultiThreadStopReason::SignalWithThread {
            tid: self.running_thread(),
            signal,
        }
    }

    fn running_thread(&self) -> Tid {
        thread_of(self.debuggee.vcpus().0)
    }

    /// The guest as thread `tid`'s vCPU sees it.
    fn view_of(&self, tid: Tid) -> Result<GuestView<'_>, TargetError<DebugError>> {
        let vcpu = tid.get() - 1;
        if vcpu >= self.debuggee.vcpus().1 {
            return Err(TargetError::NonFatal);
        }
        self.debuggee.view_of(vcpu).map_err(TargetError::Fatal)
    }
}

/// vCPU `vcpu`'s gdb thread id.
fn thread_of(vcpu: usize) -> Tid {
    Tid::new(vcpu + 1).expect("not zero")
}

impl Target for ReplayTarget {
    type Arch = X86_64_SSE;
    type Error = DebugError;

    fn base_ops(&mut self) -> BaseOps<'_, Self::Arch, Self::Error> {
        BaseOps::MultiThread(self)
    }

    fn support_breakpoints(&mut self) -> Option<BreakpointsOps<'_, Self>> {
        Some(self)
    }

    fn support_monitor_cmd(&mut self) -> Option<MonitorCmdOps<'_, Self>> {
        Some(self)
    }

    /// gdb's software breakpoints would be memory writes, which a replay
    /// refuses with a clear "cannot access memory": allowed to try.
    fn guard_rail_implicit_sw_breakpoints(&self) -> bool {
        true
    }
}

impl MultiThreadBase for ReplayTarget {
    fn read_registers(&mut self, regs: &mut X86_64CoreRegs, tid: Tid) -> TargetResult<(), Self> {
        let view = self.view_of(tid)?;
        let r = &view.regs;
        regs.regs = [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ];
        regs.rip = r.rip;
        regs.eflags = r.rflags as u32;
        let s = &view.sregs;
        regs.segments.cs = s.cs.selector.into();
        regs.segments.ss = s.ss.selector.into();
        regs.segments.ds = s.ds.selector.into();
        regs.segments.es = s.es.selector.into();
        regs.segments.fs = s.fs.selector.into();
        regs.segments.gs = s.gs.selector.into();
        Ok(())
    }

    fn write_registers(&mut self, _: &X86_64CoreRegs, _: Tid) -> TargetResult<(), Self> {
        Err(TargetError::NonFatal)
    }

    /// Guest virtual memory under the thread's vCPU's page tables, up to
    /// the first unmapped page.
    fn read_addrs(&mut self, start: u64, data: &mut [u8], tid: Tid) -> TargetResult<usize, Self> {
        let view = self.view_of(tid)?;
        let mut done = 0;
        while done < data.len() {
            let at = start.wrapping_add(done as u64);
            let in_page = (4096 - at % 4096) as usize;
            let end = data.len().min(done + in_page);
            if view.read(at, &mut data[done..end]).is_err() {
                break;
            }
            done = end;
        }
        if done == 0 && !data.is_empty() {
            return Err(TargetError::Errno(EFAULT));
        }
        Ok(done)
    }

    fn write_addrs(&mut self, _: u64, _: &[u8], _: Tid) -> TargetResult<(), Self> {
        Err(TargetError::Errno(EFAULT))
    }

    fn list_active_threads(&mut self, active: &mut dyn FnMut(Tid)) -> Result<(), Self::Error> {
        (0..self.debuggee.vcpus().1).for_each(|vcpu| active(thread_of(vcpu)));
        Ok(())
    }

    fn support_resume(&mut self) -> Option<MultiThreadResumeOps<'_, Self>> {
        Some(self)
    }
}

impl MultiThreadResume for ReplayTarget {
    /// The actions set it already (see `clear_resume_actions`).
    fn resume(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// A continue, unless a thread is stepped.
    fn clear_resume_actions(&mut self) -> Result<(), Self::Error> {
        self.resume = Resume::Continue;
        Ok(())
    }

    fn set_resume_action_continue(&mut self, _: Tid, _: Option<Signal>) -> Result<(), Self::Error> {
        Ok(())
    }

    fn support_single_step(&mut self) -> Option<MultiThreadSingleStepOps<'_, Self>> {
        Some(self)
    }

    fn support_reverse_cont(&mut self) -> Option<ReverseContOps<'_, Tid, Self>> {
        Some(self)
    }

    fn support_reverse_step(&mut self) -> Option<ReverseStepOps<'_, Tid, Self>> {
        Some(self)
    }

    fn support_scheduler_locking(&mut self) -> Option<MultiThreadSchedulerLockingOps<'_, Self>> {
        Some(self)
    }
}

impl MultiThreadSchedulerLocking for ReplayTarget {
    /// Granted in name only: the replay runs the vCPUs in the log's order
    /// and cannot hold one. gdb asks it to step the stopped thread over a
    /// breakpoint, and that thread is the running vCPU.
    fn set_resume_action_scheduler_lock(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl MultiThreadSingleStep for ReplayTarget {
    fn set_resume_action_step(&mut self, _: Tid, _: Option<Signal>) -> Result<(), Self::Error> {
        self.resume = Resume::Step;
        Ok(())
    }
}

impl ReverseCont<Tid> for ReplayTarget {
    fn reverse_cont(&mut self) -> Result<(), Self::Error> {
        self.resume = Resume::ReverseContinue;
        Ok(())
    }
}

impl ReverseStep<Tid> for ReplayTarget {
    fn reverse_step(&mut self, _: Tid) -> Result<(), Self::Error> {
        self.resume = Resume::ReverseStep;
        Ok(())
    }
}

impl Breakpoints for ReplayTarget {
    fn support_hw_breakpoint(&mut self) -> Option<HwBreakpointOps<'_, Self>> {
        Some(self)
    }
}

impl HwBreakpoint for ReplayTarget {
    fn add_hw_breakpoint(&mut self, address: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.debuggee.add_breakpoint(address))
    }

    fn remove_hw_breakpoint(&mut self, address: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.debuggee.remove_breakpoint(address))
    }
}

impl MonitorCmd for ReplayTarget {
    fn handle_monitor_cmd(
        &mut self,
        command: &[u8],
        mut out: ConsoleOutput<'_>,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(command);
        // gdb gives up on a monitor command after `remotetimeout` (2 s)
        // without a packet: a long run says where it is each second.
        let mut last = Instant::now();
        let mut progress = |event| {
            if last.elapsed() >= KEEPALIVE {
                gdbstub::outputln!(out, "(replaying: at event {event})");
                out.flush();
                last = Instant::now();
            }
        };
        let text = monitor::run(&mut self.debuggee, &command, &mut progress);
        gdbstub::outputln!(out, "{}", text.trim_end());
        Ok(())
    }
}
