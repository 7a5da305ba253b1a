//! Stopping the guest for an observer: breakpoints and single steps set
//! with `Vm::set_guest_debug`, the steps the VMM makes unseen (over a
//! breakpoint, with breakpoints where the host cannot step with the trap
//! flag), and the logged interrupt window a replay runs to; and the state
//! they keep from one entry into the guest to the next (`DebugState`).

use std::cell::Cell;

use kvm_bindings::{kvm_debug_exit_arch, kvm_debugregs};
use kvm_ioctls::Kvm;

use crate::guest_debug::{self, DebugStop, GuestDebug, GuestDebugError};
use crate::logged_stop::{self, StopBreakpoint, StopKind};
use crate::preemption;
use crate::probes::breakpoint_step::{self, StepMethod};
use crate::vcpu::{self, RESUME_FLAG};

use super::layout::MSR_LSTAR;
use super::user_trap::UserTrap;
use super::{Entry, Vm, VmError};

/// What stops the guest and the steps on the way there: the debugger's
/// breakpoints and steps, the steps the VMM makes unseen, and the logged
/// stop a replay runs to. Apart from the rest of the VM because they go
/// together: KVM takes them as one `GuestDebug`, which each change here
/// hands it again (`Vm::apply_guest_debug`).
pub(super) struct DebugState {
    /// What the guest stops at (`set_guest_debug`).
    pub(super) guest_debug: GuestDebug,
    /// The guest stopped at a breakpoint and must step over it on re-entry.
    pub(super) step_over_due: bool,
    /// It is stepping over one, with its breakpoints lifted.
    pub(super) stepping_over: bool,
    /// How this host single-steps the guest unseen (`breakpoint_step`).
    pub(super) step_method: StepMethod,
    /// While a step is made with breakpoints: how many of the armed ones
    /// are the debugger's (the rest make the step).
    pub(super) step_breakpoints: Option<usize>,
    /// The last entry ended without an exit or a debug stop (a signal
    /// kicked the vCPU out), so a step made with breakpoints is still
    /// under way: it goes on to the breakpoints it was armed with.
    pub(super) step_kicked: bool,
    /// The logged stop a replay runs the guest to: a preemption, or an
    /// interrupt window (`Delivery::LoggedWindow`).
    pub(super) logged_stop: StopBreakpoint,
    /// The guest's debug registers before the logged stop's breakpoint
    /// was armed, for the stops it makes (see `Vm::logged_stop_made`).
    pub(super) logged_stop_debugregs: Option<kvm_debugregs>,
    /// The search for a logged preemption in user code, on a host that
    /// stops user mode at no breakpoint (`vm::user_trap`).
    pub(super) user_trap: Option<UserTrap>,
    /// Whether a replay takes its preemptions in user mode one pass late
    /// (`ONE_PASS_LATE`).
    one_pass_late: OnePassLate,
}

/// Set (to anything), a replay takes each preemption in user mode found
/// with a hardware breakpoint one pass late: at the next stop at its
/// place with its registers, in whatever state. For the tests that show
/// that a replay notices preemptions placed on the wrong pass, not a
/// user's option. (One alone can leave no trace: two_counters' process
/// that counted one pass more may end one pass sooner.)
const ONE_PASS_LATE: &str = "PROVM_REPLAY_PREEMPTION_ONE_PASS_LATE";

#[derive(Clone, Copy, PartialEq, Eq)]
enum OnePassLate {
    Off,
    /// At each instance found.
    Armed,
    /// The instance was passed over: the next pass is taken.
    Passed,
}

impl DebugState {
    /// Nothing to stop at yet, stepping as this host's KVM allows
    /// (`breakpoint_step::host_method`, which runs a guest of a few bytes).
    pub(super) fn for_host(kvm: &Kvm) -> Result<Self, VmError> {
        Ok(DebugState {
            guest_debug: GuestDebug::default(),
            step_over_due: false,
            stepping_over: false,
            step_method: breakpoint_step::host_method(kvm)?,
            step_breakpoints: None,
            step_kicked: false,
            logged_stop: StopBreakpoint::default(),
            logged_stop_debugregs: None,
            user_trap: None,
            one_pass_late: if std::env::var_os(ONE_PASS_LATE).is_some() {
                OnePassLate::Armed
            } else {
                OnePassLate::Off
            },
        })
    }
}

impl Vm {
    /// What a debug stop was for the logged stop a replay runs to.
    pub(super) fn logged_stop(&mut self, debug: &kvm_debug_exit_arch) -> Result<StopKind, VmError> {
        if !self.debug.logged_stop.aimed() {
            return Ok(StopKind::Other);
        }
        let now = self.vcpu.place()?;
        if self.on_user_trap(now) {
            return self.user_trap_stop();
        }
        let mut stop = self.debug.logged_stop.stop(debug.dr6, now);
        let mut logged_flags = None;
        if stop != StopKind::Other && self.debug.logged_stop.preemption().is_some() {
            if stop == StopKind::Passing {
                logged_flags = self.logged_status_flags()?;
            }
            let registers_match = stop == StopKind::Reached || logged_flags.is_some();
            stop = self.preemption_stop(registers_match)?;
        }
        if let Some(rflags) = logged_flags.filter(|_| stop == StopKind::Reached) {
            tracing::debug!(
                "logged stop: reached with RFLAGS {:#x}, set to the logged {rflags:#x}",
                self.vcpu.exit_registers()?.rflags
            );
            self.vcpu.set_exit_flags(rflags)?;
        }
        if stop != StopKind::Other {
            tracing::trace!(
                "logged stop: {stop:?} at RIP {:#x}, registers {:016x}",
                now.rip,
                now.registers
            );
        }
        Ok(stop)
    }

    /// The RFLAGS logged at the logged stop, where the guest stands at its
    /// RIP in its registers but for status flags. QEMU's TCG (the SVM test
    /// bed's guest runs under it) shows a flag that the last instruction
    /// left undefined with one value at a kick and another at a breakpoint
    /// stop at the same place: after BT, OF and AF (the SVM bed,
    /// 2026-12-01). The flags set as logged, the state is the recording's
    /// where the rest of it matches too: a preemption's instance, whose
    /// memory is checked. (A logged window, found by its registers alone,
    /// is not looked for so: passes that differ in flags and memory only,
    /// a counter in memory compared at each, would all match.)
    fn logged_status_flags(&self) -> Result<Option<u64>, VmError> {
        let Some(place) = self.debug.logged_stop.place() else {
            return Ok(None);
        };
        let regs = self.vcpu.exit_registers()?;
        Ok(vcpu::status_flags_giving(&regs, place.registers))
    }

    /// A stop at the RIP of the preemption the guest runs to: reached
    /// where the registers (`registers_match`) and the rest of the state
    /// are the logged instance's (`preemption`).
    fn preemption_stop(&mut self, registers_match: bool) -> Result<StopKind, VmError> {
        let reached = registers_match && self.in_logged_instance()?;
        // The guest kernel's passes may differ only in what it overwrites
        // before it is read: user code's are the test.
        let in_user_mode = self
            .debug
            .logged_stop
            .preemption()
            .is_some_and(|instance| instance.user_code.is_some());
        let late = &mut self.debug.one_pass_late;
        let stop = match *late {
            OnePassLate::Armed if in_user_mode && reached => {
                *late = OnePassLate::Passed;
                StopKind::Passing
            }
            OnePassLate::Passed if in_user_mode && registers_match => {
                *late = OnePassLate::Armed;
                tracing::warn!("a preemption taken one pass late, as {ONE_PASS_LATE} asks");
                StopKind::Reached
            }
            _ if reached => StopKind::Reached,
            _ => StopKind::Passing,
        };
        if stop == StopKind::Passing {
            self.seam.passed_logged_stop();
        }
        Ok(stop)
    }

    /// Whether the guest's state beyond its place (its registers
    /// matched) is the instance of the preemption it runs to.
    pub(super) fn in_logged_instance(&self) -> Result<bool, VmError> {
        let instance = self
            .debug
            .logged_stop
            .preemption()
            .expect("running to a preemption");
        let digest = preemption::digest(
            &self.vcpu,
            &self.memory,
            &instance.pages,
            instance.user_code.is_some(),
        )?;
        if digest != instance.digest {
            tracing::trace!(
                "preemption: the registers match, the state does not ({digest:016x}, logged {:016x})",
                instance.digest
            );
        }
        Ok(digest == instance.digest)
    }

    /// Reads the guest's DR6 before the logged stop's breakpoint is armed
    /// (`aimed`): one KVM_GET_DEBUGREGS per logged stop aimed at, none
    /// where none is.
    pub(super) fn keep_guest_debugregs(&mut self, aimed: bool) -> Result<(), VmError> {
        self.debug.logged_stop_debugregs = if aimed {
            Some(self.vcpu.fd.get_debug_regs().map_err(VmError::Kvm)?)
        } else {
            None
        };
        Ok(())
    }

    /// After a stop made by the logged stop's breakpoint or by the step
    /// over it (`done`: the logged stop is reached): clears the hit and single-step
    /// bits of DR6 that the guest did not have before the breakpoint was
    /// armed, where KVM shows them, so that a replay's state check
    /// compares the guest's registers and not provm's marks. Nothing else
    /// is put back: a value the guest wrote meanwhile stays. KVM_GET_DEBUGREGS
    /// reports KVM's copy of the guest's registers (`vcpu->arch`), which
    /// a stop for KVM_SET_GUEST_DEBUG leaves alone in Linux 6.1 to 6.12:
    /// SVM's `db_interception` copies the VMCB's DR6 to `kvm_run` only and
    /// the next entry loads DR6's reset value, VMX reports the exit
    /// qualification; so this reads, and writes only where a KVM does
    /// otherwise.
    pub(super) fn logged_stop_made(&mut self, done: bool) -> Result<(), VmError> {
        let kept = if done {
            self.debug.logged_stop_debugregs.take()
        } else {
            self.debug.logged_stop_debugregs
        };
        let Some(kept) = kept else {
            return Ok(());
        };
        let mut now = self.vcpu.fd.get_debug_regs().map_err(VmError::Kvm)?;
        let marks = logged_stop::dr6_marks(kept.dr6, now.dr6);
        if marks != 0 {
            tracing::debug!(
                "logged stop: the stop set DR6 bits {marks:#x} (DR6 {:#x}, was {:#x}): cleared",
                now.dr6,
                kept.dr6
            );
            now.dr6 &= !marks;
            self.vcpu.fd.set_debug_regs(&now).map_err(VmError::Kvm)?;
        }
        Ok(())
    }

    /// A debug stop for the debugger, or on its way (a step over a
    /// breakpoint, a step made with breakpoints).
    pub(super) fn debug_stop(&mut self, debug: &kvm_debug_exit_arch) -> Result<Entry, VmError> {
        self.run_loop.at_exit = false;
        let (dr6, pc) = (debug.dr6, debug.pc);
        tracing::trace!(
            dr6 = format_args!("{dr6:#x}"),
            pc = format_args!("{pc:#x}"),
            stepping_over = self.debug.stepping_over,
            step_breakpoints = ?self.debug.step_breakpoints,
            "debug exit"
        );
        let stop = match (DebugStop::from_kvm(debug), self.debug.step_breakpoints) {
            // One of the breakpoints that make a step, not the debugger's.
            (DebugStop::Breakpoint { index, rip }, Some(theirs)) if index >= theirs => {
                DebugStop::Step {
                    rip,
                    resumed: false,
                }
            }
            // A step with the trap flag over an IRET whose frame set RF:
            // a breakpoint here would not fire (see `breakpoint_step`).
            (DebugStop::Step { rip, .. }, _)
                if self.debug.step_method == StepMethod::Breakpoints =>
            {
                let rflags = self.vcpu.exit_registers()?.rflags;
                DebugStop::Step {
                    rip,
                    resumed: rflags & RESUME_FLAG != 0,
                }
            }
            (stop, _) => stop,
        };
        if std::mem::take(&mut self.debug.stepping_over) {
            // The step over the logged stop's breakpoint is provm's own stop.
            if self.debug.logged_stop.aimed() {
                self.logged_stop_made(false)?;
            }
            // Stepped past the breakpoint: put the breakpoints back.
            self.apply_guest_debug(&self.debug.guest_debug)?;
            if !self.debug.guest_debug.single_step {
                return Ok(Entry::Kicked);
            }
        }
        self.debug.step_over_due = stop.needs_step_over(&self.debug.guest_debug);
        Ok(Entry::Debug(stop))
    }

    /// Stops the guest at `debug`'s breakpoints, or after every
    /// instruction; an empty `debug` turns stopping off.
    pub fn set_guest_debug(&mut self, debug: &GuestDebug) -> Result<(), VmError> {
        self.debug.guest_debug = debug.clone();
        self.debug.step_kicked = false;
        if !self.debug.stepping_over {
            self.apply_guest_debug(debug)?;
        }
        Ok(())
    }

    /// Before entering a guest that single-steps: on a host whose guest
    /// would see the trap flag, puts breakpoints where the instruction at
    /// RIP continues (see `breakpoint_step::arm`), after the debugger's own;
    /// on a host that steps with the flag, takes it off for a return to
    /// user mode (see `breakpoint_step::arm_past_user_mode`).
    pub(super) fn arm_breakpoint_step(&mut self) -> Result<(), VmError> {
        // A step kicked out of the guest before it reached its breakpoints
        // (the fault handler or interrupt handler a step runs, a signal
        // at any time) goes on to them: KVM keeps them. Armed again from
        // where the kick left the guest, it would end one instruction
        // later, at a place that depends on the host's timing; on the SVM
        // test bed a step over a user instruction whose page fault ran
        // wp_page_copy ended there in one re-execution and after the
        // handler in the next, so a reverse-stepi went somewhere else.
        if std::mem::take(&mut self.debug.step_kicked) && self.debug.step_breakpoints.is_some() {
            return Ok(());
        }
        let was_armed = self.debug.step_breakpoints.take().is_some();
        // Before every entry: nothing to do (and nothing to copy) unless
        // the guest is stepping.
        let stepping = self.debug.stepping_over || self.debug.guest_debug.single_step;
        if !stepping {
            self.vcpu.sync_system_registers(false);
            return Ok(());
        }
        let in_force = if self.debug.stepping_over {
            guest_debug::step_over()
        } else {
            self.debug.guest_debug.clone()
        };
        // Where the last exit left the guest (a step's stop, mostly): as
        // KVM copied it out then, the system registers with the rest from
        // that step on; LSTAR only for a SYSCALL or a return to user mode.
        self.vcpu.sync_system_registers(true);
        let regs = self.vcpu.exit_registers()?;
        let sregs = self.vcpu.exit_system_registers()?;
        let unread_lstar = Cell::new(None);
        let syscall_entry = || {
            self.vcpu
                .msr(MSR_LSTAR)
                .map_err(|error| unread_lstar.set(Some(error)))
                .ok()
        };
        let arm = match self.debug.step_method {
            StepMethod::Breakpoints => breakpoint_step::arm,
            StepMethod::TrapFlag => breakpoint_step::arm_past_user_mode,
        };
        let armed = arm(&in_force, &regs, &sregs, &syscall_entry, &self.memory);
        if let Some(error) = unread_lstar.take() {
            return Err(error.into());
        }
        // A step is one instruction: a logged window it lands on is seen
        // at its stop, and needs no breakpoint of its own.
        match armed {
            Some(armed) => {
                tracing::trace!(rip = regs.rip, ?armed, "step armed");
                self.apply_without_window(&armed)?;
                self.debug.step_breakpoints = Some(in_force.breakpoints.len());
            }
            // With the trap flag, what was in force stays unless a return
            // to user mode took the flag off at the last entry.
            None if self.debug.step_method == StepMethod::TrapFlag && !was_armed => {}
            None => {
                tracing::trace!(rip = regs.rip, "step with the trap flag");
                self.apply_without_window(&in_force)?
            }
        }
        Ok(())
    }

    /// Hands `debug` to KVM, with the breakpoint of the logged stop the
    /// guest runs to, if any.
    pub(super) fn apply_guest_debug(&self, debug: &GuestDebug) -> Result<(), VmError> {
        self.apply_to_kvm(&self.debug.logged_stop.added_to(debug)?)
    }

    pub(super) fn apply_without_window(&self, debug: &GuestDebug) -> Result<(), VmError> {
        self.debug.logged_stop.left_out();
        self.apply_to_kvm(debug)
    }

    pub(super) fn apply_to_kvm(&self, debug: &GuestDebug) -> Result<(), VmError> {
        self.vcpu
            .fd
            .set_guest_debug(&debug.to_kvm()?)
            .map_err(|error| VmError::GuestDebug(GuestDebugError::Set(error)))
    }
}
