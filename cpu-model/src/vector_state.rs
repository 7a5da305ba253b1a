//! Vector registers the guest kernel cannot save, and the kernel argument
//! that keeps guest processes from corrupting each other's.
//!
//! A hypervisor that runs guest user mode with the host's CPU state (PVM:
//! the guest sees the host's CPUID, so KVM leaves XSAVE visible, see
//! `hidden::unenforced`) lets user code use every register the host's XCR0
//! enables, AVX and AVX-512 included, while the guest kernel, told there is
//! no XSAVE, saves only the FXSAVE area (x87, SSE) at a context switch.
//! There the VMM saves and loads each task's whole vector state for the
//! kernel (patch 0011), which then preempts user mode anywhere. Where
//! CPUID is enforced (VMX, SVM), the guest cannot turn on AVX without
//! XSAVE and nothing is needed.

use crate::hidden::HiddenFeature;

/// Kernel patch 0008's argument: no preemption at an interrupt's or
/// exception's return to user mode, so that tasks switch only at system
/// calls, where no vector register is live. What recordings before trace
/// format 14 booted with on PVM, which could not find a preemption in
/// user code again; their replays boot with it still.
pub const NO_USER_PREEMPTION: &str = "provm.user_preempt=0";

/// Kernel patch 0011's argument: the VMM saves and loads each task's
/// vector state (`provm_vmm::devices::vector_state`).
pub const VMM_KEEPS_VECTOR_STATE: &str = "provm.vector_state=vmm";

/// The kernel argument the guest needs, given the hidden features KVM left
/// visible: [`VMM_KEEPS_VECTOR_STATE`] when user space can reach vector
/// state beyond SSE that the kernel cannot save; else nothing.
pub fn kernel_args(unenforced: &[&HiddenFeature]) -> &'static str {
    // std's AVX detection reads XCR0: the host's OS enables the YMM state
    // (AVX-512 needs it too).
    args_for(unenforced, std::arch::is_x86_feature_detected!("avx"))
}

fn args_for(unenforced: &[&HiddenFeature], host_enables_avx: bool) -> &'static str {
    let user_sees_xsave = unenforced.iter().any(|feature| feature.name == "xsave");
    if user_sees_xsave && host_enables_avx {
        VMM_KEEPS_VECTOR_STATE
    } else {
        ""
    }
}

/// Whether a guest booted with `kernel_args` leaves user mode's vector
/// state beyond SSE to something other than its kernel (either argument).
pub fn kept_outside_the_kernel(kernel_args: &str) -> bool {
    kernel_args
        .split_whitespace()
        .any(|arg| arg == NO_USER_PREEMPTION || arg == VMM_KEEPS_VECTOR_STATE)
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
    fn the_vmm_keeps_vector_state_only_where_the_kernel_cannot() {
        // VMX/SVM: CPUID is enforced, XSAVE really hidden.
        assert_eq!(args_for(&[], true), "");
        assert_eq!(args_for(&[named("rdrand")], true), "");
        // Visible XSAVE, but the host's XCR0 has only x87 and SSE.
        assert_eq!(args_for(&[named("xsave")], false), "");
        let pvm = [named("rdrand"), named("xsave"), named("avx")];
        assert_eq!(args_for(&pvm, true), VMM_KEEPS_VECTOR_STATE);
    }

    #[test]
    fn either_argument_leaves_vector_state_outside_the_kernel() {
        assert!(kept_outside_the_kernel(
            "console=ttyS0 provm.user_preempt=0"
        ));
        assert!(kept_outside_the_kernel("provm.vector_state=vmm quiet"));
        assert!(!kept_outside_the_kernel(
            "console=ttyS0 provm.user_preempt=1"
        ));
    }
}
