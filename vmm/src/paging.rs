//! Reading guest virtual memory through the guest's own page tables, as an
//! observer at a stop does: the kernel's structures, and a process's user
//! memory through its CR3.
//!
//! KVM_TRANSLATE would walk the tables too, but only under the vCPU's
//! current CR3 and one ioctl per page; an observer also reads other
//! processes' memory (their page tables are in guest RAM). x86-64 4-level
//! paging only: provm's kernel has no 5-level paging (CONFIG_X86_5LEVEL off).

use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;

const PRESENT: u64 = 1;
/// In a PDPTE or PDE: maps a 1 GiB or 2 MiB page instead of a table.
const LARGE_PAGE: u64 = 1 << 7;
/// Bits 12-51: the physical address a table entry points at.
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;
const PAGE: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("guest virtual address {0:#x} is not mapped")]
pub struct Unmapped(pub u64);

/// The guest physical address of `virt` under the page tables at `cr3`.
pub fn translate(memory: &GuestMemory, cr3: u64, virt: u64) -> Result<u64, Unmapped> {
    let mut table = cr3 & ADDRESS_MASK;
    // Levels 4 (PML4) to 1 (PT); each indexes 9 bits from bit 39 down.
    for level in (1..=4u32).rev() {
        let shift = 12 + 9 * (level - 1);
        let index = (virt >> shift) & 0x1ff;
        let entry: u64 = memory
            .read_obj(GuestAddress(table + index * 8))
            .map_err(|_| Unmapped(virt))?;
        if entry & PRESENT == 0 {
            return Err(Unmapped(virt));
        }
        let base = entry & ADDRESS_MASK;
        if level == 1 || (level <= 3 && entry & LARGE_PAGE != 0) {
            let offset_mask = (1u64 << shift) - 1;
            return Ok((base & !offset_mask) | (virt & offset_mask));
        }
        table = base;
    }
    unreachable!("level 1 always returns")
}

/// Fills `buf` from guest virtual address `virt` under `cr3`, page by page.
pub fn read(memory: &GuestMemory, cr3: u64, virt: u64, buf: &mut [u8]) -> Result<(), Unmapped> {
    let mut done = 0;
    while done < buf.len() {
        let address = virt.wrapping_add(done as u64);
        let in_page = ((PAGE - address % PAGE) as usize).min(buf.len() - done);
        let physical = translate(memory, cr3, address)?;
        memory
            .read_slice(&mut buf[done..done + in_page], GuestAddress(physical))
            .map_err(|_| Unmapped(address))?;
        done += in_page;
    }
    Ok(())
}

/// The bytes an instruction at `rip` can span (15), or as many of them as
/// are mapped under `cr3`. Through the page tables, not KVM_TRANSLATE: that
/// walks them as a supervisor read, which SMAP refuses for user pages
/// (measured on the SVM test bed).
pub fn instruction_bytes(memory: &GuestMemory, cr3: u64, rip: u64) -> Vec<u8> {
    const LONGEST: usize = 15;
    let on_page = ((PAGE - rip % PAGE) as usize).min(LONGEST);
    let mut code = vec![0; LONGEST];
    if read(memory, cr3, rip, &mut code[..on_page]).is_err() {
        return Vec::new();
    }
    if on_page < LONGEST && read(memory, cr3, rip + on_page as u64, &mut code[on_page..]).is_err() {
        code.truncate(on_page);
    }
    code
}

/// Page tables for unit tests.
#[cfg(test)]
pub(crate) mod test_tables {
    use super::*;
    use crate::memory;

    /// The tables' root.
    pub(crate) const CR3: u64 = 0x1000;
    const PDPT: u64 = 0x2000;
    const PD: u64 = 0x3000;
    const PT: u64 = 0x4000;
    /// Where the kernel half begins, mapped 4 KiB a page.
    pub(crate) const KERNEL: u64 = 0xffff_8000_0000_0000;

    /// 64 MiB of RAM whose tables at `CR3` map `KERNEL` to 0x10_0000 and
    /// the page after it to 0x20_0000 through a full walk, and 2 MiB at
    /// 0x4020_0000 to 0x40_0000 through a large PDE.
    pub(crate) fn guest() -> GuestMemory {
        let memory = memory::create(64).unwrap();
        let write = |at: u64, entry: u64| memory.write_obj(entry, GuestAddress(at)).unwrap();
        write(CR3 + 256 * 8, PDPT | PRESENT);
        write(PDPT, PD | PRESENT);
        write(PD, PT | PRESENT);
        write(PT, 0x10_0000 | PRESENT);
        write(PT + 8, 0x20_0000 | PRESENT);
        write(CR3, PDPT | PRESENT);
        write(PDPT + 8, PD | PRESENT);
        write(PD + 8, 0x40_0000 | PRESENT | LARGE_PAGE);
        memory
    }
}

#[cfg(test)]
mod tests {
    use super::test_tables::{guest, CR3 as PML4};
    use super::*;

    #[test]
    fn a_four_level_walk_and_a_large_page_translate() {
        let memory = guest();
        let kernel = 0xffff_8000_0000_0000;
        assert_eq!(translate(&memory, PML4, kernel + 0x123), Ok(0x10_0123));
        assert_eq!(translate(&memory, PML4, kernel + 0x1456), Ok(0x20_0456));
        assert_eq!(translate(&memory, PML4, 0x4020_1234), Ok(0x40_1234));
        assert_eq!(
            translate(&memory, PML4, kernel + 0x2000),
            Err(Unmapped(kernel + 0x2000))
        );
    }

    #[test]
    fn a_read_crosses_pages_that_are_not_contiguous_in_ram() {
        let memory = guest();
        memory
            .write_slice(b"hello ", GuestAddress(0x10_0ffa))
            .unwrap();
        memory
            .write_slice(b"world", GuestAddress(0x20_0000))
            .unwrap();
        let mut buf = [0u8; 11];
        read(&memory, PML4, 0xffff_8000_0000_0ffa, &mut buf).unwrap();
        assert_eq!(&buf, b"hello world");
    }

    /// An instruction's bytes span two pages where both are mapped, stop
    /// where the next is not, and are none on an unmapped page.
    #[test]
    fn instruction_bytes_are_as_many_as_are_mapped() {
        let memory = guest();
        let kernel = 0xffff_8000_0000_0000;
        assert_eq!(instruction_bytes(&memory, PML4, kernel + 0xffa).len(), 15);
        assert_eq!(instruction_bytes(&memory, PML4, kernel + 0x1ffa).len(), 6);
        assert!(instruction_bytes(&memory, PML4, kernel + 0x2000).is_empty());
    }
}
