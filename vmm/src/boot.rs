//! Loading the guest kernel: an ELF vmlinux entered through its PVH entry
//! point (32-bit protected mode, paging off), with the initramfs as a PVH
//! module. PVH needs no real-mode setup code and no decompressor, which is
//! what keeps boot short when guest ring 0 is emulated.

use std::fs::File;

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::{load_cmdline, KernelLoader};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use crate::memory::GuestMemory;

/// Where the boot-time structures go in low memory (all below 1 MiB, which the
/// kernel keeps for itself until it has copied them).
pub const GDT_START: GuestAddress = GuestAddress(0x500);
const START_INFO_START: GuestAddress = GuestAddress(0x6000);
const MODLIST_START: GuestAddress = GuestAddress(0x6800);
const MEMMAP_START: GuestAddress = GuestAddress(0x7000);
const CMDLINE_START: GuestAddress = GuestAddress(0x20000);
/// The kernel's limit for its command line (COMMAND_LINE_SIZE on x86).
pub const CMDLINE_MAX: usize = 2048;
/// End of conventional memory: the BIOS data area above it is not RAM.
const EBDA_START: u64 = 0x9fc00;
const HIGH_MEMORY_START: GuestAddress = GuestAddress(0x10_0000);
const PAGE_SIZE: u64 = 4096;

const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
const E820_RAM: u32 = 1;

/// The flat 32-bit segments PVH entry requires: null, code, data, TSS.
pub const GDT: [u64; 4] = [
    0,
    0x00cf_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x0000_8b00_0000_0067,
];

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("the kernel is not a loadable ELF vmlinux ({0}); provm boots the uncompressed vmlinux that `provm kernel build` makes")]
    KernelNotElf(linux_loader::loader::Error),
    #[error("the kernel has no PVH entry point; build it with CONFIG_PVH=y (as kernels/provm.config does)")]
    NoPvhEntry,
    #[error("the initramfs ({initramfs} bytes) does not fit in guest memory above the kernel; give the guest more memory")]
    InitramfsTooLarge { initramfs: usize },
    #[error("the kernel command line is longer than {CMDLINE_MAX} bytes or malformed: {0}")]
    Cmdline(String),
    #[error("cannot write boot data to guest memory: {0}")]
    Memory(String),
}

/// Where the vCPU starts and what it is handed.
#[derive(Clone, Copy, Debug)]
pub struct EntryPoint {
    /// The kernel's PVH entry (32-bit protected mode).
    pub entry: GuestAddress,
    /// The hvm_start_info structure, passed in EBX.
    pub start_info: GuestAddress,
}

/// Loads the kernel, initramfs and command line and writes the PVH start info.
pub fn load_kernel(
    memory: &GuestMemory,
    kernel: &mut File,
    initramfs: &[u8],
    cmdline: &str,
) -> Result<EntryPoint, BootError> {
    let loaded = Elf::load(memory, None, kernel, Some(HIGH_MEMORY_START))
        .map_err(BootError::KernelNotElf)?;
    let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
        return Err(BootError::NoPvhEntry);
    };

    let initramfs_start = place_initramfs(memory, loaded.kernel_end, initramfs.len())?;
    memory
        .write_slice(initramfs, initramfs_start)
        .map_err(|e| BootError::Memory(e.to_string()))?;

    let mut kernel_cmdline =
        Cmdline::new(CMDLINE_MAX).map_err(|e| BootError::Cmdline(e.to_string()))?;
    kernel_cmdline
        .insert_str(cmdline)
        .map_err(|e| BootError::Cmdline(e.to_string()))?;
    load_cmdline(memory, CMDLINE_START, &kernel_cmdline)
        .map_err(|e| BootError::Cmdline(e.to_string()))?;

    write_start_info(memory, initramfs_start, initramfs.len() as u64)?;
    let gdt_bytes: Vec<u8> = GDT.iter().flat_map(|entry| entry.to_le_bytes()).collect();
    memory
        .write_slice(&gdt_bytes, GDT_START)
        .map_err(|e| BootError::Memory(e.to_string()))?;

    Ok(EntryPoint {
        entry,
        start_info: START_INFO_START,
    })
}

/// The initramfs goes at the top of RAM, page aligned, clear of the kernel.
fn place_initramfs(
    memory: &GuestMemory,
    kernel_end: u64,
    len: usize,
) -> Result<GuestAddress, BootError> {
    let too_large = BootError::InitramfsTooLarge { initramfs: len };
    let ram_end = memory.last_addr().raw_value() + 1;
    let start = ram_end.checked_sub(len as u64).ok_or(too_large)? & !(PAGE_SIZE - 1);
    if start < kernel_end {
        return Err(BootError::InitramfsTooLarge { initramfs: len });
    }
    Ok(GuestAddress(start))
}

fn write_start_info(
    memory: &GuestMemory,
    initramfs: GuestAddress,
    initramfs_len: u64,
) -> Result<(), BootError> {
    let ram_end = memory.last_addr().raw_value() + 1;
    let memmap = [
        hvm_memmap_table_entry {
            addr: 0,
            size: EBDA_START,
            type_: E820_RAM,
            reserved: 0,
        },
        hvm_memmap_table_entry {
            addr: HIGH_MEMORY_START.raw_value(),
            size: ram_end - HIGH_MEMORY_START.raw_value(),
            type_: E820_RAM,
            reserved: 0,
        },
    ];
    let module = hvm_modlist_entry {
        paddr: initramfs.raw_value(),
        size: initramfs_len,
        ..Default::default()
    };
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC,
        version: 1,
        nr_modules: 1,
        modlist_paddr: MODLIST_START.raw_value(),
        cmdline_paddr: CMDLINE_START.raw_value(),
        memmap_paddr: MEMMAP_START.raw_value(),
        memmap_entries: memmap.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&start_info, START_INFO_START);
    params.set_sections(&memmap, MEMMAP_START);
    params.set_modules(&[module], MODLIST_START);
    PvhBootConfigurator::write_bootparams(&params, memory)
        .map_err(|e| BootError::Memory(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initramfs_goes_page_aligned_at_the_top_of_ram() {
        let memory = crate::memory::create(64).unwrap();
        let start = place_initramfs(&memory, 0x200_0000, 5000).unwrap();
        assert_eq!(start.raw_value() % PAGE_SIZE, 0);
        assert!(start.raw_value() + 5000 <= 64 << 20);
        assert!(start.raw_value() + 5000 + PAGE_SIZE > 64 << 20);
    }

    #[test]
    fn initramfs_must_not_overlap_the_kernel() {
        let memory = crate::memory::create(64).unwrap();
        assert!(matches!(
            place_initramfs(&memory, 0x300_0000, 40 << 20),
            Err(BootError::InitramfsTooLarge { .. })
        ));
    }

    #[test]
    fn start_info_describes_ram_and_the_module() {
        let memory = crate::memory::create(64).unwrap();
        write_start_info(&memory, GuestAddress(0x300_0000), 1234).unwrap();
        let info: hvm_start_info = memory.read_obj(START_INFO_START).unwrap();
        assert_eq!(info.magic, XEN_HVM_START_MAGIC);
        assert_eq!(info.nr_modules, 1);
        assert_eq!(info.memmap_entries, 2);
        let high: hvm_memmap_table_entry = memory
            .read_obj(
                MEMMAP_START.unchecked_add(std::mem::size_of::<hvm_memmap_table_entry>() as u64),
            )
            .unwrap();
        assert_eq!(high.addr + high.size, 64 << 20);
        let module: hvm_modlist_entry = memory.read_obj(MODLIST_START).unwrap();
        assert_eq!((module.paddr, module.size), (0x300_0000, 1234));
    }

    #[test]
    fn a_non_elf_kernel_is_refused() {
        let memory = crate::memory::create(64).unwrap();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[0u8; 4096]).unwrap();
        assert!(matches!(
            load_kernel(&memory, &mut file, &[], "console=ttyS0"),
            Err(BootError::KernelNotElf(_))
        ));
    }
}
