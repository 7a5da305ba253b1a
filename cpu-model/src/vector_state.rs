//! Vector registers the guest kernel cannot save, and the kernel argument
//! that keeps guest processes from corrupting each other's.
//!
//! A hypervisor that runs guest user mode with the host's CPU state (PVM:
//! the guest sees the host's CPUID, so KVM leaves XSAVE visible, see
//! `hidden::unenforced`) lets user code use every register the host's XCR0
//! enables, AVX and AVX-512 included, while the guest kernel, told there is
//! no XSAVE, saves only the FXSAVE area (x87, SSE) at a context switch.
//! There the kernel is asked (patch 0008) to switch tasks only at system
//! calls, where the C ABI leaves no vector register live, never at an
//! interrupt's return. Where CPUID is enforced (VMX, SVM), the guest cannot
//! turn on AVX without XSAVE and nothing is needed.

use crate::hidden::HiddenFeature;

/// Kernel patch 0008's argument: no preemption at an interrupt's or
/// exception's return to user mode.
pub const NO_USER_PREEMPTION: &str = "provm.user_preempt=0";

/// The kernel argument the guest needs, given the hidden features KVM left
/// visible: [`NO_USER_PREEMPTION`] when user space can reach vector state
/// beyond SSE that the kernel cannot save, else nothing.
pub fn kernel_args(unenforced: &[&HiddenFeature]) -> &'static str {
    // std's AVX detection reads XCR0: the host's OS enables the YMM state
    // (AVX-512 needs it too).
    args_for(unenforced, std::arch::is_x86_feature_detected!("avx"))
}

fn args_for(unenforced: &[&HiddenFeature], host_enables_avx: bool) -> &'static str {
    let user_sees_xsave = unenforced.iter().any(|feature| feature.name == "xsave");
    if user_sees_xsave && host_enables_avx {
        NO_USER_PREEMPTION
    } else {
        ""
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
        // VMX/SVM: CPUID is enforced, XSAVE really hidden.
        assert_eq!(args_for(&[], true), "");
        assert_eq!(args_for(&[named("rdrand")], true), "");
        // Visible XSAVE, but the host's XCR0 has only x87 and SSE.
        assert_eq!(args_for(&[named("xsave")], false), "");
    }

    #[test]
    fn user_mode_is_not_preempted_where_ymm_state_would_leak() {
        let pvm = [named("rdrand"), named("xsave"), named("avx")];
        assert_eq!(args_for(&pvm, true), NO_USER_PREEMPTION);
    }
}
