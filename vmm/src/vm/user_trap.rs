//! A replay's search for a preemption in guest user code on a host that
//! stops user mode at no breakpoint (PVM), with `int3`s and the guest
//! kernel's `#BP` handler (`crate::user_trap`): the run loop's side.
//!
//! Each pass through the logged RIP is a stop on the handler
//! (`Vm::user_trap_stop`) and a return to user mode that ends in an
//! interrupt-window exit at the instruction (`Vm::user_trap_returned`);
//! the pass whose state is the logged instance's is the preemption, and
//! the others are stepped over. Neither is a VM exit the seam sees.

use kvm_bindings::kvm_regs;

use crate::logged_stop::StopKind;
use crate::paging::{self, Unmapped};
use crate::probes::breakpoint_step;
use crate::seam::Place;
use crate::user_trap::{EntryFrame, Patches, BREAKPOINT_VECTOR, INT3};
use crate::vcpu;

use super::layout::KERNEL_SPACE;
use super::{Vm, VmError};

/// The search under way.
pub(super) struct UserTrap {
    /// The logged place's RIP, and the guest physical address of its
    /// instruction.
    target: u64,
    target_code: u64,
    /// The guest kernel's `#BP` handler, where the breakpoint stops it.
    handler: u64,
    /// The `int3`s in guest code (on the target, or, while a pass is
    /// stepped over, on the places it goes next), and the IRETQ while the
    /// guest goes back to user mode: laid while the guest runs, lifted at
    /// every stop (`Vm::run_once`).
    pub(super) patches: Patches,
    stepping: bool,
    returning: Option<Return>,
}

/// A return to user mode under way, through the IRETQ written over the
/// handler.
struct Return {
    /// Where the IRETQ is, guest physical.
    iretq: u64,
    /// Where it returns to.
    rip: u64,
    /// Whether that is the logged instance.
    instance: bool,
}

impl Vm {
    /// Where the guest stands in user mode at a recording's preemption at
    /// `rip`: the guest physical address of the instruction there
    /// (`Instance::user_code`); `None` in the kernel.
    pub(super) fn user_code_at(&self, rip: u64) -> Result<Option<u64>, VmError> {
        let sregs = self.vcpu.exit_system_registers()?;
        if !vcpu::is_user_mode(&sregs) {
            return Ok(None);
        }
        paging::translate(&self.memory, sregs.cr3, rip)
            .map(Some)
            .map_err(|error| VmError::UserTrap {
                rip,
                why: error.to_string(),
            })
    }

    /// Starts the search for the logged preemption at `rip`, in user code
    /// at guest physical `code`, from here.
    pub(super) fn arm_user_trap(&mut self, rip: u64, code: u64) -> Result<(), VmError> {
        let sregs = self.vcpu.system_registers()?;
        let handler = breakpoint_step::interrupt_handler(&sregs, &self.memory, BREAKPOINT_VECTOR)
            .ok_or_else(|| VmError::UserTrap {
            rip,
            why: "the guest's IDT cannot be read".into(),
        })?;
        let mut patches = Patches::default();
        patches.add_physical(code, &[INT3]);
        tracing::debug!("user trap: int3 on {rip:#x} ({code:#x}), #BP handler {handler:#x}");
        self.debug.user_trap = Some(UserTrap {
            target: rip,
            target_code: code,
            handler,
            patches,
            stepping: false,
            returning: None,
        });
        self.debug.logged_stop.trap_at(Some(handler));
        Ok(())
    }

    /// Ends the search. Its patches are lifted: the guest is stopped.
    pub(super) fn disarm_user_trap(&mut self) {
        self.debug.user_trap = None;
        self.debug.logged_stop.trap_at(None);
    }

    /// Whether the guest stopped on the handler of the search under way.
    pub(super) fn on_user_trap(&self, now: Place) -> bool {
        self.debug
            .user_trap
            .as_ref()
            .is_some_and(|trap| trap.returning.is_none() && trap.handler == now.rip)
    }

    /// Whether the guest is on its way back to user mode.
    pub(super) fn returning_from_user_trap(&self) -> bool {
        self.debug
            .user_trap
            .as_ref()
            .is_some_and(|trap| trap.returning.is_some())
    }

    /// At a stop on the `#BP` handler: one of the search's `int3`s, or the
    /// guest's own (which its handler then takes, `Passing`). The pass is
    /// looked at where the `int3` was the target's, and the guest goes
    /// back to the instruction, to stop there before it runs if the pass
    /// is the instance and to step over it if not.
    pub(super) fn user_trap_stop(&mut self) -> Result<StopKind, VmError> {
        let mut trap = self.debug.user_trap.take().expect("a search under way");
        let result = self.look_at_pass(&mut trap);
        self.debug.user_trap = Some(trap);
        let stop = result?;
        if stop == StopKind::Searching {
            self.logged_stop_made(false)?;
            // The IRETQ stands on the breakpoint's instruction: lift it.
            self.debug.logged_stop.hold(true);
            self.apply_guest_debug(&self.debug.guest_debug)?;
            self.vcpu.request_interrupt_window(true);
        }
        Ok(stop)
    }

    fn look_at_pass(&mut self, trap: &mut UserTrap) -> Result<StopKind, VmError> {
        let failed = |why: String| VmError::UserTrap {
            rip: trap.target,
            why,
        };
        let unmapped = |error: Unmapped| failed(error.to_string());
        let regs = self.vcpu.exit_registers()?;
        let sregs = self.vcpu.exit_system_registers()?;
        let frame = EntryFrame::read(&self.memory, sregs.cr3, regs.rsp).map_err(unmapped)?;
        let at = frame.int3_address();
        let code = paging::translate(&self.memory, sregs.cr3, at);
        let ours = frame.from_user_mode() && code.is_ok_and(|code| trap.patches.covers(code));
        if !ours {
            return Ok(StopKind::Passing);
        }
        // The user's registers, as they were at the int3.
        let user = kvm_regs {
            rip: at,
            rsp: frame.rsp,
            rflags: frame.rflags,
            ..regs
        };
        let at_target = at == trap.target && code == Ok(trap.target_code);
        let instance = !trap.stepping && at_target && self.is_logged_instance(&user)?;
        trap.patches.clear();
        if trap.stepping {
            trap.stepping = false;
            trap.patches.add_physical(trap.target_code, &[INT3]);
        } else if !instance {
            if at_target {
                self.seam.passed_logged_stop();
            }
            let next = breakpoint_step::user_successors(&user, &sregs, &self.memory)
                .filter(|places| places.iter().all(|&place| place < KERNEL_SPACE))
                .ok_or_else(|| failed(format!("cannot step over the instruction at {at:#x}")))?;
            for place in next {
                trap.patches
                    .add_int3(&self.memory, sregs.cr3, place)
                    .map_err(unmapped)?;
            }
            trap.stepping = true;
        }
        EntryFrame::write_rip(&self.memory, sregs.cr3, regs.rsp, at).map_err(unmapped)?;
        let iretq = trap
            .patches
            .add_iretq(&self.memory, sregs.cr3, trap.handler)
            .map_err(unmapped)?;
        trap.returning = Some(Return {
            iretq,
            rip: at,
            instance,
        });
        Ok(StopKind::Searching)
    }

    /// Whether the guest, with the user's registers `user`, is the logged
    /// preemption's instance.
    fn is_logged_instance(&self, user: &kvm_regs) -> Result<bool, VmError> {
        let now = Place {
            rip: user.rip,
            registers: vcpu::register_digest(user),
        };
        if self.debug.logged_stop.place() != Some(now) {
            tracing::trace!("user trap: a pass at {:#x} in other registers", user.rip);
            return Ok(false);
        }
        self.in_logged_instance()
    }

    /// At the interrupt-window exit that ends a return to user mode: the
    /// IRETQ is taken off the handler and its breakpoint put back. Returns
    /// whether the guest now stands at the logged instance.
    pub(super) fn user_trap_returned(&mut self) -> Result<bool, VmError> {
        let trap = self.debug.user_trap.as_mut().expect("a search under way");
        let returning = trap.returning.take().expect("returning");
        trap.patches.remove(returning.iretq);
        let target = trap.target;
        // No window was asked for before: the guest, in user mode with
        // interrupts on, would have made that exit before it got here.
        self.vcpu.request_interrupt_window(false);
        let now = self.vcpu.exit_registers()?.rip;
        if now != returning.rip {
            return Err(VmError::UserTrap {
                rip: target,
                why: format!(
                    "the return to user mode at {:#x} stopped at {now:#x}",
                    returning.rip
                ),
            });
        }
        self.debug.logged_stop.hold(false);
        if returning.instance {
            self.disarm_user_trap();
            return Ok(true);
        }
        self.apply_guest_debug(&self.debug.guest_debug)?;
        Ok(false)
    }
}
