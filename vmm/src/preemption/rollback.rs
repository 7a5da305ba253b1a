//! Putting guest RAM back as it was at a point of a replay: a shadow copy
//! kept equal to RAM at each sync, and the pages written since, which KVM's
//! dirty log names for the guest's writes and the memory's own bitmap for
//! the VMM's (`memory::GuestMemory`). A replay that ran past the instance
//! a preemption was logged at (`late_arming`) rolls back to the stretch's
//! start with it, copying only what the guest wrote on the way.
//!
//! KVM's log must be on (`preemption::log_written_pages`), and nothing else
//! may read it: each read clears it.

use kvm_ioctls::VmFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::pages_set;
use crate::memory::GuestMemory;

const PAGE: usize = 4096;

/// A copy of guest RAM, one per slot of `memory::register`'s.
#[derive(Default)]
pub struct Shadow {
    copies: Vec<Vec<u8>>,
}

impl Shadow {
    /// Makes the copy equal RAM: all of it the first time, then only the
    /// pages written since the last sync or rollback. Returns how many
    /// pages it copied.
    pub fn sync(&mut self, vm: &VmFd, memory: &GuestMemory) -> Result<usize, kvm_ioctls::Error> {
        let first = self.copies.is_empty();
        let mut copied = 0;
        for (slot, region) in memory.iter().enumerate() {
            let written = written_since_last_asked(vm, slot, region)?;
            let start = region.start_addr();
            if first {
                let mut copy = vec![0; region.len() as usize];
                memory
                    .read_slice(&mut copy, start)
                    .expect("a region reads whole");
                copied += copy.len() / PAGE;
                self.copies.push(copy);
                continue;
            }
            for page in pages_set(&written) {
                let at = page * PAGE;
                memory
                    .read_slice(
                        &mut self.copies[slot][at..at + PAGE],
                        GuestAddress(start.0 + at as u64),
                    )
                    .expect("a page the log names is in its region");
                copied += 1;
            }
        }
        Ok(copied)
    }

    /// Puts back, from the copy, every page written since the last sync
    /// or rollback: RAM is as it was then. Returns how many pages it put
    /// back.
    pub fn roll_back(&self, vm: &VmFd, memory: &GuestMemory) -> Result<usize, kvm_ioctls::Error> {
        assert!(!self.copies.is_empty(), "a rollback follows a sync");
        let mut restored = 0;
        for (slot, region) in memory.iter().enumerate() {
            let written = written_since_last_asked(vm, slot, region)?;
            let start = region.start_addr();
            for page in pages_set(&written) {
                let at = page * PAGE;
                memory
                    .write_slice(
                        &self.copies[slot][at..at + PAGE],
                        GuestAddress(start.0 + at as u64),
                    )
                    .expect("a page the log names is in its region");
                restored += 1;
            }
            // Those writes were the copy's own bytes: RAM equals it again.
            region_bitmap(region).reset();
        }
        Ok(restored)
    }
}

/// The pages of `region` (slot `slot`) written since this was last asked,
/// by the guest or by the VMM, a bit per page; both logs are cleared.
fn written_since_last_asked(
    vm: &VmFd,
    slot: usize,
    region: &<GuestMemory as GuestMemoryBackend>::R,
) -> Result<Vec<u64>, kvm_ioctls::Error> {
    let mut written = vm.get_dirty_log(slot as u32, region.len() as usize)?;
    let by_vmm = region_bitmap(region).get_and_reset();
    for (word, vmm_word) in written.iter_mut().zip(by_vmm) {
        *word |= vmm_word;
    }
    Ok(written)
}

fn region_bitmap(
    region: &<GuestMemory as GuestMemoryBackend>::R,
) -> &vm_memory::bitmap::AtomicBitmap {
    // The mapping's own bitmap, not the trait's slice of it.
    std::ops::Deref::deref(region).bitmap()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RAM written by the guest (KVM's log) and by the VMM (the bitmap)
    /// after a sync comes back as it was at the sync, and only the pages
    /// written are copied. Needs /dev/kvm for the dirty log.
    #[test]
    fn a_rollback_puts_back_the_pages_written_since_the_sync() {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let memory = crate::memory::create(crate::memory::MIN_MEMORY_MIB).unwrap();
        crate::memory::register(&vm, &memory).unwrap();
        crate::preemption::log_written_pages(&vm, &memory).unwrap();
        let at = |page: u64| GuestAddress(page * PAGE as u64 + 8);
        memory.write_obj(1u64, at(3)).unwrap();
        let mut shadow = Shadow::default();
        let pages_of_ram = (crate::memory::MIN_MEMORY_MIB << 20) as usize / PAGE;
        assert_eq!(shadow.sync(&vm, &memory).unwrap(), pages_of_ram);
        memory.write_obj(2u64, at(3)).unwrap();
        memory.write_obj(9u64, at(5)).unwrap();
        assert_eq!(shadow.roll_back(&vm, &memory).unwrap(), 2);
        assert_eq!(memory.read_obj::<u64>(at(3)).unwrap(), 1);
        assert_eq!(memory.read_obj::<u64>(at(5)).unwrap(), 0);
        // Nothing written since the rollback: nothing to copy or put back.
        assert_eq!(shadow.roll_back(&vm, &memory).unwrap(), 0);
        memory.write_obj(4u64, at(7)).unwrap();
        assert_eq!(shadow.sync(&vm, &memory).unwrap(), 1);
        memory.write_obj(5u64, at(7)).unwrap();
        shadow.roll_back(&vm, &memory).unwrap();
        assert_eq!(memory.read_obj::<u64>(at(7)).unwrap(), 4);
    }
}
