//! A guest of a few bytes of 32-bit code and nothing else: what the VMM
//! runs to learn how this host's KVM behaves (the probes of `port_exit`,
//! `breakpoint_step` and `interrupt_window`), and what its unit tests run.

use std::sync::OnceLock;

use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{Bytes, GuestAddress};

use crate::boot::{EntryPoint, GDT, GDT_START};
use crate::memory::GuestMemory;
use crate::vcpu::{self, Vcpu, VcpuError};

/// Where the code is loaded and starts.
pub const CODE: GuestAddress = GuestAddress(0x1000);

pub struct CodeGuest {
    /// Kept open for the vCPU's sake.
    _vm: VmFd,
    pub memory: GuestMemory,
    pub vcpu: Vcpu,
}

/// The answer of `probe`, run at most once per process: what a probe
/// measures is the host's KVM, which does not change under it.
pub fn probe_once<T: Copy>(
    answer: &'static OnceLock<T>,
    probe: impl FnOnce() -> Result<T, VcpuError>,
) -> Result<T, VcpuError> {
    if let Some(known) = answer.get() {
        return Ok(*known);
    }
    let probed = probe()?;
    Ok(*answer.get_or_init(|| probed))
}

impl CodeGuest {
    /// A vCPU about to run `code` in flat 32-bit protected mode, with 1 MiB
    /// of memory; `msrs_to_vmm` routes the MSR reads provm answers to it.
    pub fn new(kvm: &Kvm, code: &[u8], msrs_to_vmm: bool) -> Result<Self, VcpuError> {
        let vm = kvm.create_vm().map_err(VcpuError::Probe)?;
        if msrs_to_vmm {
            crate::msr::route_reads_to_vmm(&vm).map_err(VcpuError::Probe)?;
        }
        let memory = GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)])
            .expect("1 MiB at 0 is a valid layout");
        crate::memory::register(&vm, &memory).map_err(VcpuError::Probe)?;
        let gdt: Vec<u8> = GDT.iter().flat_map(|entry| entry.to_le_bytes()).collect();
        memory
            .write_slice(&gdt, GDT_START)
            .expect("the GDT lies in the first MiB");
        memory
            .write_slice(code, CODE)
            .expect("the code fits in the first MiB");
        let vcpu = Vcpu::new(kvm, &vm, &vcpu::supported_cpuid(kvm)?)?;
        vcpu.enter_pvh(EntryPoint {
            entry: CODE,
            start_info: GuestAddress(0),
        })?;
        Ok(CodeGuest {
            _vm: vm,
            memory,
            vcpu,
        })
    }
}
