//! The MSRs whose value KVM would take from the host, answered by the VMM
//! instead. KVM answers most RDMSRs in the kernel from state that is the
//! same on every host (EFER, STAR, the APIC base, the microcode revision
//! KVM reports, ...); these few it would answer from the host's TSC and
//! counters. A read filter (KVM_X86_SET_MSR_FILTER, with
//! KVM_CAP_X86_USER_SPACE_MSR) sends the guest's reads of them to the VMM
//! as KVM_EXIT_X86_RDMSR, where the seam sees them and this fixed model
//! answers. Writes still go to KVM: only what the guest reads matters.

use kvm_bindings::{kvm_enable_cap, KVM_CAP_X86_USER_SPACE_MSR, KVM_MSR_EXIT_REASON_FILTER};
use kvm_ioctls::{MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VmFd};

pub const IA32_TSC: u32 = 0x10;
const IA32_TSC_ADJUST: u32 = 0x3b;
const PLATFORM_INFO: u32 = 0xce;
const IA32_MPERF: u32 = 0xe7;
const IA32_APERF: u32 = 0xe8;
const IA32_ARCH_CAPABILITIES: u32 = 0x10a;
const TSC_AUX: u32 = 0xc000_0103;

/// The MSRs the VMM answers. Their model values (`read`): the TSC is the
/// virtual clock (a 1 GHz TSC, like the PIT's time source); TSC_ADJUST is
/// 0 (never adjusted); APERF/MPERF are 0 (counters that do not count: no
/// frequency feedback, and CPUID does not offer them); PLATFORM_INFO is 0
/// (no ratios, no CPUID faulting); TSC_AUX is 0 (processor 0);
/// ARCH_CAPABILITIES is 0 (KVM passes on the host CPU's and microcode's
/// vulnerability bits, which the guest kernel reads at boot to choose its
/// mitigations when CPUID offers the MSR: 0 claims no immunity, so the
/// guest takes every mitigation, the same on every host).
pub const ANSWERED_BY_VMM: [u32; 7] = [
    IA32_TSC,
    IA32_TSC_ADJUST,
    PLATFORM_INFO,
    IA32_MPERF,
    IA32_APERF,
    IA32_ARCH_CAPABILITIES,
    TSC_AUX,
];

/// The model's value of MSR `index`, one of `ANSWERED_BY_VMM`;
/// `virtual_ns` reads the virtual clock, only for the TSC.
pub fn read(index: u32, virtual_ns: impl FnOnce() -> u64) -> u64 {
    match index {
        IA32_TSC => virtual_ns(),
        _ => 0,
    }
}

/// Makes the guest's reads of `ANSWERED_BY_VMM` exit to the VMM.
pub fn route_reads_to_vmm(vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_X86_USER_SPACE_MSR,
        ..Default::default()
    };
    cap.args[0] = KVM_MSR_EXIT_REASON_FILTER.into();
    vm.enable_cap(&cap)?;
    // One range per MSR; its one bitmap bit clear denies the read to KVM.
    let denied = [0u8];
    let ranges: Vec<MsrFilterRange<'_>> = ANSWERED_BY_VMM
        .iter()
        .map(|&base| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ,
            base,
            msr_count: 1,
            bitmap: &denied,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tsc_reads_the_clock() {
        assert_eq!(read(IA32_TSC, || 42), 42);
        for index in ANSWERED_BY_VMM.into_iter().filter(|&i| i != IA32_TSC) {
            assert_eq!(read(index, || panic!("{index:#x} read the clock")), 0);
        }
    }
}
