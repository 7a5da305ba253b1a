//! Guest physical memory: one RAM region from address 0, below the MMIO
//! window where the virtio devices live.

use vm_memory::{GuestAddress, GuestMemoryMmap};

pub type GuestMemory = GuestMemoryMmap<()>;

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
    let bytes = mib << 20;
    if bytes > MMIO_START {
        return Err(MemoryError::TooLarge(mib));
    }
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), bytes as usize)])
        .map_err(|source| MemoryError::Allocation { mib, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryBackend;

    #[test]
    fn sizes_are_checked() {
        assert!(matches!(create(16), Err(MemoryError::TooSmall(16))));
        assert!(matches!(create(4096), Err(MemoryError::TooLarge(4096))));
        let memory = create(64).unwrap();
        assert_eq!(memory.last_addr(), GuestAddress((64 << 20) - 1));
    }
}
