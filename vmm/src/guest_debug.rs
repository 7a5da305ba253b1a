//! Stopping the guest for an observer: hardware breakpoints and single-step
//! through KVM_SET_GUEST_DEBUG.
//!
//! A debug stop is not a VM exit the guest caused: the VMM injects nothing
//! there and tells the seam nothing, so a replay with breakpoints makes
//! exactly the exits of one without (see `Vm::run`).
//!
//! On VMX and SVM hosts KVM loads DR0-DR3 and DR7 from here while the guest
//! runs, so breakpoints and single-step trap in any guest mode. On PVM hosts
//! only guest ring 0, which PVM emulates, traps; nothing in guest ring 3 does
//! (PLATFORM.md). Breakpoints on kernel code work on both.

use kvm_bindings::{
    kvm_debug_exit_arch, kvm_guest_debug, kvm_guest_debug_arch, KVM_GUESTDBG_ENABLE,
    KVM_GUESTDBG_SINGLESTEP, KVM_GUESTDBG_USE_HW_BP,
};

/// The x86 debug registers give four instruction breakpoints.
pub const HW_BREAKPOINTS: usize = 4;

/// DR6: which of DR0-DR3 matched (bits 0-3), and single-step (BS, bit 14).
const DR6_HIT_MASK: u64 = 0xf;
const DR6_SINGLE_STEP: u64 = 1 << 14;
/// DR7: bit 2n globally enables breakpoint n; its R/W and LEN fields (bits
/// 16 + 4n) stay 0, "break on instruction execution".
const fn dr7_enable(index: usize) -> u64 {
    1 << (2 * index + 1)
}
/// DR7 bit 10 reads as 1.
const DR7_FIXED: u64 = 1 << 10;

/// What the guest should stop at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestDebug {
    /// Guest virtual addresses of instructions; at most `HW_BREAKPOINTS`.
    pub breakpoints: Vec<u64>,
    /// Stop after every instruction (where the platform traps it).
    pub single_step: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum GuestDebugError {
    #[error("the CPU has {HW_BREAKPOINTS} hardware breakpoints; {0} were asked for")]
    TooManyBreakpoints(usize),
    #[error("this replay runs the guest to the interrupt windows and preemptions its recording logged, with one of the CPU's {HW_BREAKPOINTS} hardware breakpoints: the debugger may use {} at most", HW_BREAKPOINTS - 1)]
    WindowBreakpoint,
    #[error("KVM_SET_GUEST_DEBUG failed: {0}")]
    Set(kvm_ioctls::Error),
}

impl GuestDebug {
    pub fn is_active(&self) -> bool {
        !self.breakpoints.is_empty() || self.single_step
    }

    /// The argument of KVM_SET_GUEST_DEBUG.
    pub fn to_kvm(&self) -> Result<kvm_guest_debug, GuestDebugError> {
        if self.breakpoints.len() > HW_BREAKPOINTS {
            return Err(GuestDebugError::TooManyBreakpoints(self.breakpoints.len()));
        }
        let mut arch = kvm_guest_debug_arch::default();
        let mut dr7 = DR7_FIXED;
        for (index, &address) in self.breakpoints.iter().enumerate() {
            arch.debugreg[index] = address;
            dr7 |= dr7_enable(index);
        }
        arch.debugreg[7] = dr7;
        let mut control = 0;
        if self.is_active() {
            control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP;
        }
        if self.single_step {
            control |= KVM_GUESTDBG_SINGLESTEP;
        }
        Ok(kvm_guest_debug {
            control,
            pad: 0,
            arch,
        })
    }
}

/// Why the guest stopped for the debugger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugStop {
    /// It reached the instruction of breakpoint `index` (of
    /// `GuestDebug::breakpoints`), at `rip`, and has not executed it.
    Breakpoint { index: usize, rip: u64 },
    /// It executed one instruction and stands at `rip`. `resumed`: with
    /// RFLAGS.RF set there (an IRET restored it from its frame), so that a
    /// breakpoint at `rip` does not fire: a run that does not step passes
    /// it. Only where the host honours RF (SVM and VMX; see `Vm`).
    Step { rip: u64, resumed: bool },
}

impl DebugStop {
    /// Reads KVM's description of a debug exit.
    pub fn from_kvm(exit: &kvm_debug_exit_arch) -> DebugStop {
        let hits = exit.dr6 & DR6_HIT_MASK;
        if hits != 0 && exit.dr6 & DR6_SINGLE_STEP == 0 {
            DebugStop::Breakpoint {
                index: hits.trailing_zeros() as usize,
                rip: exit.pc,
            }
        } else {
            DebugStop::Step {
                rip: exit.pc,
                resumed: false,
            }
        }
    }

    pub fn rip(&self) -> u64 {
        match *self {
            DebugStop::Breakpoint { rip, .. } | DebugStop::Step { rip, .. } => rip,
        }
    }

    /// Whether resuming under `debug` must step over an instruction
    /// breakpoint where the guest stands: the one that stopped it, or one a
    /// single step landed on. An instruction breakpoint is a fault, taken
    /// when the guest is entered at it, so without this a step that lands
    /// on one would stop there twice (SVM and VMX; PVM's ring-0 emulator
    /// does not fault there). RFLAGS.RF would suppress it for one
    /// instruction on hardware, but PVM's emulator ignores RF; a single step
    /// without breakpoints works on every host (as gdb does it). A step
    /// that leaves RF set needs none: the breakpoint does not fire.
    pub fn needs_step_over(&self, debug: &GuestDebug) -> bool {
        match *self {
            DebugStop::Breakpoint { .. } => true,
            DebugStop::Step { rip, resumed } => !resumed && debug.breakpoints.contains(&rip),
        }
    }

    /// Whether a debugger's breakpoint at where the guest stands would
    /// have stopped a run that continued there: the breakpoint's own stop,
    /// or a step that landed on one without RF.
    pub fn at_breakpoint(&self, breakpoints: &[u64]) -> bool {
        match *self {
            DebugStop::Breakpoint { .. } => true,
            DebugStop::Step { rip, resumed } => !resumed && breakpoints.contains(&rip),
        }
    }
}

/// One instruction, with no breakpoint in the way.
pub fn step_over() -> GuestDebug {
    GuestDebug {
        breakpoints: Vec::new(),
        single_step: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoints_fill_the_debug_registers_in_order() {
        let debug = GuestDebug {
            breakpoints: vec![0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000],
            single_step: false,
        };
        let kvm = debug.to_kvm().unwrap();
        assert_eq!(kvm.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP);
        assert_eq!(kvm.arch.debugreg[0], 0xffff_ffff_8100_0000);
        assert_eq!(kvm.arch.debugreg[1], 0xffff_ffff_8200_0000);
        assert_eq!(kvm.arch.debugreg[7], DR7_FIXED | 0b1010);
    }

    #[test]
    fn nothing_asked_disables_guest_debugging() {
        assert_eq!(GuestDebug::default().to_kvm().unwrap().control, 0);
    }

    #[test]
    fn a_fifth_breakpoint_is_refused() {
        let debug = GuestDebug {
            breakpoints: vec![0; 5],
            single_step: false,
        };
        assert!(matches!(
            debug.to_kvm(),
            Err(GuestDebugError::TooManyBreakpoints(5))
        ));
    }

    #[test]
    fn dr6_names_the_breakpoint_or_the_step() {
        let exit = |dr6| kvm_debug_exit_arch {
            dr6,
            pc: 0x1000,
            ..Default::default()
        };
        assert_eq!(
            DebugStop::from_kvm(&exit(0xffff_0ff4)),
            DebugStop::Breakpoint {
                index: 2,
                rip: 0x1000
            }
        );
        assert_eq!(
            DebugStop::from_kvm(&exit(0xffff_4ff0)),
            DebugStop::Step {
                rip: 0x1000,
                resumed: false
            }
        );
    }
}
