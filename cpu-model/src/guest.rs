//! The CPU a guest gets, decided once for the VMM that boots it
//! (`Vm::new`) and for the probe that describes it (`cpu_probe`), so that a
//! recording's manifest names what its guest kernel was actually told: the
//! CPUID table each vCPU is given, and the hidden features the kernel must
//! ignore itself because KVM left them visible.

use crate::baseline::{guest_model, Baseline, BaselineError};
use crate::entry::CpuidEntry;
use crate::hidden::{self, HiddenFeature, Platform};
use crate::vector_state;

/// CPUID leaf 1, EDX: the local APIC.
const APIC: u32 = 1 << 9;

/// The guest CPU of a machine with some number of vCPUs, on one platform.
pub struct GuestCpu {
    /// The baseline's table (`guest_model`), as one vCPU gets it.
    model: Vec<CpuidEntry>,
    platform: Platform,
    /// More than one vCPU: each gets the APIC the VMM emulates for them.
    smp: bool,
}

impl GuestCpu {
    /// The CPU of a machine of `cpus` vCPUs booted with `baseline` on
    /// `platform`, from `supported` (KVM_GET_SUPPORTED_CPUID).
    pub fn new(
        supported: &[CpuidEntry],
        platform: Platform,
        baseline: Baseline,
        cpus: u8,
    ) -> Result<Self, BaselineError> {
        Ok(GuestCpu {
            model: guest_model(supported, platform, baseline)?,
            platform,
            smp: cpus > 1,
        })
    }

    /// vCPU `id`'s CPUID: with one vCPU the model as it is; with more, the
    /// model with the vCPU's initial APIC ID and the APIC the VMM emulates.
    pub fn vcpu_table(&self, id: u8) -> Vec<CpuidEntry> {
        if !self.smp {
            return self.model.clone();
        }
        self.model
            .iter()
            .map(|entry| {
                let mut entry = *entry;
                if entry.function == 1 {
                    entry.ebx = (entry.ebx & 0x00ff_ffff) | (u32::from(id) << 24);
                    entry.edx |= APIC;
                }
                entry
            })
            .collect()
    }

    /// The hidden features the guest kernel is told to ignore, given
    /// `effective`, what KVM reports the boot vCPU has after KVM_SET_CPUID2
    /// (`hidden::unenforced`): all that it still shows, but the APIC an
    /// SMP guest is given on purpose.
    pub fn ignored_by_kernel(&self, effective: &[CpuidEntry]) -> Vec<&'static HiddenFeature> {
        let mut unenforced = hidden::unenforced(effective, self.platform);
        unenforced.retain(|feature| !self.smp || feature.name != "apic");
        unenforced
    }
}

/// The kernel arguments this host's KVM makes necessary, given the hidden
/// features the kernel must ignore (`GuestCpu::ignored_by_kernel`): those
/// features, and the VMM's keeping of vector state where the kernel cannot
/// (`vector_state`).
pub fn kernel_args(ignored: &[&HiddenFeature]) -> String {
    format!(
        "{} {}",
        hidden::kernel_args_hiding(ignored),
        vector_state::kernel_args(ignored)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(cpus: u8) -> GuestCpu {
        GuestCpu {
            model: vec![CpuidEntry::all_ones(1, 0)],
            platform: Platform::Pvm,
            smp: cpus > 1,
        }
    }

    #[test]
    fn smp_vcpus_get_their_apic_id_and_the_apic() {
        let mut model = cpu(2);
        model.model[0].ebx = 0;
        model.model[0].edx = 0;
        let table = model.vcpu_table(3);
        assert_eq!(table[0].ebx >> 24, 3);
        assert_eq!(table[0].edx, APIC);
        let one = GuestCpu {
            smp: false,
            ..model
        };
        assert_eq!(one.vcpu_table(0), one.model);
    }

    #[test]
    fn only_smp_guests_keep_the_apic() {
        let effective = [CpuidEntry::all_ones(1, 0)];
        let names = |cpus| -> Vec<&str> {
            cpu(cpus)
                .ignored_by_kernel(&effective)
                .iter()
                .map(|feature| feature.name)
                .collect()
        };
        assert!(names(1).contains(&"apic"));
        assert!(!names(2).contains(&"apic"));
        assert_eq!(names(1).len(), names(2).len() + 1);
    }
}
