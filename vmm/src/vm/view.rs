//! What an observer (gdb, the analyses, an explanation) reads of the
//! guest at a stop: any vCPU's registers, the running one's or a parked
//! one's, and memory through its page tables.

use kvm_bindings::{kvm_regs, kvm_sregs};

use crate::memory::GuestMemory;
use crate::paging::{self, Unmapped};

use super::{Vm, VmError};

/// The guest as an observer sees it at a stop: its registers, and its
/// memory through its page tables. Looking is not an input: nothing here
/// changes the guest.
pub struct GuestView<'a> {
    /// Which vCPU's registers these are.
    pub vcpu: usize,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    memory: &'a GuestMemory,
}

impl GuestView<'_> {
    /// Reads guest virtual memory under the current page tables.
    pub fn read(&self, virt: u64, buf: &mut [u8]) -> Result<(), Unmapped> {
        paging::read(self.memory, self.sregs.cr3, virt, buf)
    }

    /// Reads guest virtual memory under the page tables at `cr3`: another
    /// process's memory than the running one's.
    pub fn read_under(&self, cr3: u64, virt: u64, buf: &mut [u8]) -> Result<(), Unmapped> {
        paging::read(self.memory, cr3, virt, buf)
    }
}

impl Vm {
    /// How many vCPUs the machine has.
    pub fn vcpu_count(&self) -> usize {
        self.cpus.as_ref().map_or(1, |cpus| cpus.apics.len())
    }

    /// The index of the vCPU that runs (0 until a switch; always 0 with
    /// one vCPU).
    pub fn running_vcpu(&self) -> usize {
        self.cpus
            .as_ref()
            .map_or(0, |cpus| cpus.scheduler.current())
    }

    /// The guest as it stands, for an observer: as the running vCPU sees it.
    pub fn view(&self) -> Result<GuestView<'_>, VmError> {
        self.view_of(self.running_vcpu())
    }

    /// The guest as vCPU `vcpu` sees it, running or parked: its registers
    /// and page tables.
    pub fn view_of(&self, vcpu: usize) -> Result<GuestView<'_>, VmError> {
        let seen = match &self.cpus {
            Some(cpus) if vcpu != cpus.scheduler.current() => {
                cpus.parked(vcpu).ok_or(VmError::NoVcpu(vcpu))?
            }
            None if vcpu != 0 => return Err(VmError::NoVcpu(vcpu)),
            _ => &self.vcpu,
        };
        Ok(GuestView {
            vcpu,
            regs: seen.exit_registers()?,
            sregs: seen.exit_system_registers()?,
            memory: &self.memory,
        })
    }
}
