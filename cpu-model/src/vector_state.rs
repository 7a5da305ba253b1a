//! Vector registers the guest kernel cannot save, and the kernel argument
//! that keeps guest processes from corrupting each other's.
//!
//! A hypervisor that runs guest user mode with the host's CPU state (PVM:
//! the guest sees the host's CPUID, so KVM leaves XSAVE visible, see
//! `hidden::unenforced`) lets user code use every register the host's XCR0
//! enables, AVX and AVX-512 included, while the guest kernel, told there is
//! no XSAVE, saves only the FXSAVE area (x87, SSE) at a context switch.
//! There either the kernel is asked (patch 0008) to switch tasks only at
//! system calls, where the C ABI leaves no vector register live, never at
//! an interrupt's return; or the VMM saves and loads each task's whole
//! vector state for the kernel (patch 0011), which then preempts user
//! mode anywhere. Where CPUID is enforced (VMX, SVM), the guest cannot
//! turn on AVX without XSAVE and nothing is needed.

use crate::hidden::HiddenFeature;

/// Kernel patch 0008's argument: no preemption at an interrupt's or
/// exception's return to user mode.
pub const NO_USER_PREEMPTION: &str = "provm.user_preempt=0";

/// Kernel patch 0011's argument: the VMM saves and loads each task's
/// vector state (`provm_vmm::devices::vector_state`).
pub const VMM_KEEPS_VECTOR_STATE: &str = "provm.vector_state=vmm";

/// How a guest keeps the vector state its kernel cannot save.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnsavedVectorState {
    /// The kernel switches tasks only at system calls
    /// ([`NO_USER_PREEMPTION`]): a recording's guest, which is preempted
    /// in user mode nowhere else on such a host anyway (PVM stops guest
    /// user mode at no breakpoint, so its replay could not find the
    /// instruction a preemption came at).
    #[default]
    SwitchedAtSystemCalls,
    /// The VMM saves and loads it ([`VMM_KEEPS_VECTOR_STATE`]), and the
    /// kernel preempts user mode anywhere: a run's guest.
    KeptByVmm,
}

/// The kernel argument the guest needs, given the hidden features KVM left
/// visible: when user space can reach vector state beyond SSE that the
/// kernel cannot save, the one that keeps it as `keeping` says; else
/// nothing.
pub fn kernel_args(unenforced: &[&HiddenFeature], keeping: UnsavedVectorState) -> &'static str {
    // std's AVX detection reads XCR0: the host's OS enables the YMM state
    // (AVX-512 needs it too).
    args_for(
        unenforced,
        std::arch::is_x86_feature_detected!("avx"),
        keeping,
    )
}

fn args_for(
    unenforced: &[&HiddenFeature],
    host_enables_avx: bool,
    keeping: UnsavedVectorState,
) -> &'static str {
    let user_sees_xsave = unenforced.iter().any(|feature| feature.name == "xsave");
    match keeping {
        _ if !(user_sees_xsave && host_enables_avx) => "",
        UnsavedVectorState::SwitchedAtSystemCalls => NO_USER_PREEMPTION,
        UnsavedVectorState::KeptByVmm => VMM_KEEPS_VECTOR_STATE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hidden::{DETERMINISM, EMULATOR_HOLES};

    fn named(name: &str) -> &'static HiddenFeature {
        let mut hidden = DETERMINISM.iter().chain(EMULATOR_HOLES);
        hidden.find(|f| f.name == name).unwrap()
    }

    #[test]
    fn preemption_stays_where_the_kernel_owns_the_vector_state() {
        for keeping in [
            UnsavedVectorState::SwitchedAtSystemCalls,
            UnsavedVectorState::KeptByVmm,
        ] {
            // VMX/SVM: CPUID is enforced, XSAVE really hidden.
            assert_eq!(args_for(&[], true, keeping), "");
            assert_eq!(args_for(&[named("rdrand")], true, keeping), "");
            // Visible XSAVE, but the host's XCR0 has only x87 and SSE.
            assert_eq!(args_for(&[named("xsave")], false, keeping), "");
        }
    }

    #[test]
    fn user_mode_is_not_preempted_where_ymm_state_would_leak() {
        let pvm = [named("rdrand"), named("xsave"), named("avx")];
        let keeping = UnsavedVectorState::SwitchedAtSystemCalls;
        assert_eq!(args_for(&pvm, true, keeping), NO_USER_PREEMPTION);
    }

    #[test]
    fn or_the_vmm_keeps_the_vector_state_where_asked_to() {
        let pvm = [named("rdrand"), named("xsave"), named("avx")];
        let keeping = UnsavedVectorState::KeptByVmm;
        assert_eq!(args_for(&pvm, true, keeping), VMM_KEEPS_VECTOR_STATE);
    }
}
