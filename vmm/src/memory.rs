//! Guest physical memory: one RAM region from address 0, below the MMIO
//! window where the virtio devices live.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Guest RAM, with a bit per page that the VMM's own writes set (a
/// device's, a restore's): KVM's dirty log sees only the guest's, and a
/// replay that puts the guest back (`preemption::rollback`) needs both.
pub type GuestMemory = GuestMemoryMmap<AtomicBitmap>;

/// Devices are mapped from here up; RAM must end below it.
pub const MMIO_START: u64 = 0xd000_0000;
/// Size of one virtio-mmio device's register window.
pub const MMIO_DEVICE_SIZE: u64 = 0x1000;
/// Smallest guest that boots the kernel and runs a command.
pub const MIN_MEMORY_MIB: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("guest memory of {0} MiB is too small: at least {MIN_MEMORY_MIB} MiB are needed")]
    TooSmall(u64),
    #[error("guest memory of {0} MiB does not fit below the device window at {MMIO_START:#x}")]
    TooLarge(u64),
    #[error("the saved memory does not fit this guest's {0} MiB")]
    ImageOutOfRange(u64),
    #[error("could not allocate {mib} MiB of guest memory: {source}")]
    Allocation {
        mib: u64,
        source: vm_memory::mmap::FromRangesError,
    },
}

/// Allocates `mib` MiB of guest RAM starting at guest physical address 0.
pub fn create(mib: u64) -> Result<GuestMemory, MemoryError> {
    if mib < MIN_MEMORY_MIB {
        return Err(MemoryError::TooSmall(mib));
    }
    let bytes = mib
        .checked_mul(1 << 20)
        .filter(|&bytes| bytes <= MMIO_START)
        .ok_or(MemoryError::TooLarge(mib))?;
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes as usize)])
        .map_err(|source| MemoryError::Allocation { mib, source })
}

/// The granularity at which zero memory is left out of an image.
pub const PAGE_SIZE: usize = 4096;

/// Guest RAM as a snapshot holds it: only the pages that are not all zero,
/// as runs of consecutive pages. A fresh guest's RAM is zero, so the image
/// restores into it exactly.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MemoryImage {
    /// Runs of non-zero pages: guest physical address and contents.
    pub runs: Vec<(u64, Vec<u8>)>,
}

impl MemoryImage {
    /// Copies the non-zero pages of `memory`.
    pub fn capture(memory: &GuestMemory) -> MemoryImage {
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut page = [0u8; PAGE_SIZE];
        let end = memory.last_addr().0 + 1;
        for address in (0..end).step_by(PAGE_SIZE) {
            memory
                .read_slice(&mut page, GuestAddress(address))
                .expect("every page below the end of RAM is mapped");
            if is_zero(&page) {
                continue;
            }
            match runs.last_mut() {
                Some((start, bytes)) if *start + bytes.len() as u64 == address => {
                    bytes.extend_from_slice(&page)
                }
                _ => runs.push((address, page.to_vec())),
            }
        }
        MemoryImage { runs }
    }

    /// Writes the image into `memory`, which must be zero (freshly created).
    pub fn restore(&self, memory: &GuestMemory) -> Result<(), MemoryError> {
        for (address, bytes) in &self.runs {
            memory
                .write_slice(bytes, GuestAddress(*address))
                .map_err(|_| MemoryError::ImageOutOfRange(memory_mib(memory)))?;
        }
        Ok(())
    }
}

/// Whether every byte is zero: an OR over whole words, which compiles to
/// vector instructions, where a byte loop that stops at the first non-zero
/// byte does not. Snapshots and state digests test every page of RAM, and
/// on an emulated host (the test beds) the byte loop took most of a
/// snapshot's 1.2 to 1.9 s.
pub fn is_zero(bytes: &[u8]) -> bool {
    let (words, rest) = bytes.split_at(bytes.len() / 8 * 8);
    let any = words.chunks_exact(8).fold(0, |any, word| {
        any | u64::from_ne_bytes(word.try_into().expect("8 bytes"))
    });
    any == 0 && rest.iter().all(|&b| b == 0)
}

/// The size of `memory` in MiB.
pub fn memory_mib(memory: &GuestMemory) -> u64 {
    (memory.last_addr().0 + 1) >> 20
}

/// Hands every region of `memory` to the VM `vm` as a memory slot.
pub(crate) fn register(vm: &VmFd, memory: &GuestMemory) -> Result<(), kvm_ioctls::Error> {
    register_with_flags(vm, memory, 0)
}

/// Like `register`, with the slots' `flags` (KVM_MEM_*); called again
/// for the same memory, it changes only the flags.
pub(crate) fn register_with_flags(
    vm: &VmFd,
    memory: &GuestMemory,
    flags: u32,
) -> Result<(), kvm_ioctls::Error> {
    for (slot, region) in memory.iter().enumerate() {
        let region_spec = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags,
        };
        // SAFETY: the caller keeps `memory` mapped for the VM's whole life
        // (a Vm or CodeGuest owns both), and slots do not overlap.
        unsafe { vm.set_user_memory_region(region_spec) }?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_set_anywhere_is_not_zero() {
        for len in [0, 1, 7, 8, 9, 256, 4095, 4096] {
            let mut bytes = vec![0u8; len];
            assert!(is_zero(&bytes), "{len} zeros");
            for at in 0..len {
                bytes[at] = 0x80;
                assert!(!is_zero(&bytes), "byte {at} of {len}");
                bytes[at] = 0;
            }
        }
    }

    #[test]
    fn image_keeps_only_non_zero_pages_and_restores_them() {
        let memory = create(64).unwrap();
        memory
            .write_slice(&[1, 2, 3], GuestAddress(0x1000))
            .unwrap();
        memory.write_slice(&[4], GuestAddress(0x2fff)).unwrap();
        memory.write_slice(&[5], GuestAddress(0x10_0000)).unwrap();
        let image = MemoryImage::capture(&memory);
        let layout: Vec<(u64, usize)> = image.runs.iter().map(|(a, b)| (*a, b.len())).collect();
        assert_eq!(layout, [(0x1000, 2 * PAGE_SIZE), (0x10_0000, PAGE_SIZE)]);

        let copy = create(64).unwrap();
        image.restore(&copy).unwrap();
        assert_eq!(MemoryImage::capture(&copy), image);
        let beyond = MemoryImage {
            runs: vec![(64 << 20, vec![1; PAGE_SIZE])],
        };
        assert!(matches!(
            beyond.restore(&copy),
            Err(MemoryError::ImageOutOfRange(64))
        ));
    }

    #[test]
    fn sizes_are_checked() {
        assert!(matches!(create(16), Err(MemoryError::TooSmall(16))));
        assert!(matches!(create(4096), Err(MemoryError::TooLarge(4096))));
        // A size whose bytes overflow u64 must not wrap to a small one.
        assert!(matches!(create(1 << 60), Err(MemoryError::TooLarge(_))));
        let memory = create(64).unwrap();
        assert_eq!(memory.last_addr(), GuestAddress((64 << 20) - 1));
    }
}
