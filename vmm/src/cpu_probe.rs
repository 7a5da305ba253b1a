//! The CPU model a guest gets on this host, read from KVM: what it can
//! offer (KVM_GET_SUPPORTED_CPUID), and what a vCPU given the guest model
//! reads back (KVM_GET_CPUID2 after KVM_SET_CPUID2). A probe of the host,
//! but unlike `probes`' no guest runs for it, and it builds on the VM's
//! opening of /dev/kvm. The model itself, and every decision about it, is
//! `provm-cpu-model`'s.

use provm_cpu_model::baseline::guest_model;
use provm_cpu_model::{self as cpu_model, hidden, Baseline, CpuProbe, Platform};

use crate::vcpu::{self, Vcpu};
use crate::vm::{open_kvm, VmError};

/// The CPU model a VM booted with `baseline` gets on this host, without
/// building one.
pub fn probe_cpu(baseline: Baseline) -> Result<CpuProbe, VmError> {
    let kvm = open_kvm()?;
    let vm = kvm.create_vm().map_err(VmError::Kvm)?;
    let platform = Platform::detect();
    let supported = vcpu::supported_cpuid(&kvm)?;
    let model = guest_model(&supported, platform, baseline)?;
    let vcpu = Vcpu::new(&kvm, &vm, &model)?;
    let unenforced = hidden::unenforced(&vcpu.cpuid, platform);
    Ok(CpuProbe {
        supported,
        kernel_args: cpu_model::kernel_args(&unenforced),
        ignored_by_kernel: unenforced.iter().map(|f| f.name).collect(),
        guest: vcpu.cpuid,
    })
}
