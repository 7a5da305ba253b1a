//! The CPU model a guest gets on this host, read from KVM: what it can
//! offer (KVM_GET_SUPPORTED_CPUID), and what a vCPU given the guest model
//! reads back (KVM_GET_CPUID2 after KVM_SET_CPUID2). A probe of the host,
//! but unlike `probes`' no guest runs for it, and it builds on the VM's
//! opening of /dev/kvm. The model itself, and every decision about it, is
//! `provm-cpu-model`'s (`GuestCpu`, which `Vm::new` boots with too).

use provm_cpu_model::{self as cpu_model, Baseline, CpuProbe, GuestCpu, Platform};

use crate::vcpu::{self, Vcpu};
use crate::vm::{open_kvm, VmError};

/// The CPU model a VM of one vCPU booted with `baseline` gets on this host,
/// and what a recording's kernel is told, without building one. One vCPU
/// for every machine: an SMP guest's kernel keeps "apic"
/// (`GuestCpu::ignored_by_kernel`), yet the snapshot cache's key and a
/// recording's manifest have always named this model; naming the SMP one
/// would boot every SMP machine anew.
pub fn probe_cpu(baseline: Baseline) -> Result<CpuProbe, VmError> {
    let kvm = open_kvm()?;
    let vm = kvm.create_vm().map_err(VmError::Kvm)?;
    let supported = vcpu::supported_cpuid(&kvm)?;
    let guest_cpu = GuestCpu::new(&supported, Platform::detect(), baseline, 1)?;
    let vcpu = Vcpu::new(&kvm, &vm, &guest_cpu.vcpu_table(0))?;
    let ignored = guest_cpu.ignored_by_kernel(&vcpu.cpuid);
    Ok(CpuProbe {
        supported,
        kernel_args: cpu_model::kernel_args(&ignored),
        ignored_by_kernel: ignored.iter().map(|f| f.name).collect(),
        guest: vcpu.cpuid,
    })
}
