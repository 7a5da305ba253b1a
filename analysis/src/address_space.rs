//! A process's address space at a stop, read from the guest kernel: its
//! mappings (VMAs, from its memory map's maple tree), each named as what it
//! is (the heap, the stack, a file at an offset, anonymous memory), and its
//! memory read through its own page tables. Names the pages a process maps
//! and the frames of its backtrace.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use provm_vmm::paging::Unmapped;
use serde::{Deserialize, Serialize};

use crate::guest::Guest;
use crate::maple::{MapleOffsets, MapleTree};

/// The profile's offsets for a process's address space.
#[derive(Clone, Debug, Deserialize)]
pub struct SpaceOffsets {
    /// Negative as the profile writes it (the assembler's signed immediates).
    pub page_offset: i64,
    pub mm_struct_pgd: u64,
    pub mm_struct_start_brk: u64,
    pub mm_struct_brk: u64,
    pub mm_struct_start_stack: u64,
    /// `None` in profiles from before provm read VMAs: an address is then
    /// named from the heap's and the stack's bounds alone.
    #[serde(flatten)]
    pub vmas: Option<VmaOffsets>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct VmaOffsets {
    pub mm_struct_mm_mt: u64,
    pub vm_area_struct_vm_start: u64,
    pub vm_area_struct_vm_end: u64,
    pub vm_area_struct_vm_mm: u64,
    pub vm_area_struct_vm_pgoff: u64,
    pub vm_area_struct_vm_file: u64,
    #[serde(flatten)]
    pub maple: MapleOffsets,
}

/// What a process has at an address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Region {
    Heap,
    Stack,
    /// A file's page, at this offset in the file (its page cache).
    File {
        path: String,
        offset: u64,
    },
    /// The process's private copy of a file's page, at this offset in the
    /// file: written since it mapped it (copy-on-write), so anonymous
    /// memory to the kernel.
    FileCopy {
        path: String,
        offset: u64,
    },
    Anonymous,
    /// No mapping holds it.
    Unmapped,
}

/// How far below the start of a process's stack its stack may reach
/// (the default RLIMIT_STACK), where VMAs are not known.
const STACK_REACH: u64 = 8 << 20;
/// How far above the start of its stack the stack's top lies (argument
/// and environment strings, the auxiliary vector).
const STACK_TOP_REACH: u64 = 1 << 20;
/// The end of the user half of an address space.
const USER_END: u64 = 1 << 47;
const PAGE: u64 = 4096;

/// One mapping.
struct Vma {
    range: Range<u64>,
    /// Its file's path and the file offset of its first byte.
    file: Option<(String, u64)>,
}

/// A process's address space.
pub struct AddressSpace {
    /// The physical address of its top page table (its CR3).
    pub page_table: u64,
    heap: Range<u64>,
    stack_start: u64,
    /// In address order; `None` where the profile predates VMAs.
    vmas: Option<Vec<Vma>>,
}

impl AddressSpace {
    /// The address space of `task`; `None` for a kernel thread (it has
    /// none). Mappings that cannot be read are left out.
    pub fn of_task(
        guest: &Guest,
        offsets: &SpaceOffsets,
        task: u64,
    ) -> Result<Option<Self>, Unmapped> {
        let mm = guest.read_u64(task + guest.offsets().task_struct_mm)?;
        if mm == 0 {
            return Ok(None);
        }
        let o = offsets;
        let vmas = o
            .vmas
            .as_ref()
            .map(|vmas| read_vmas(guest, vmas, task, mm).unwrap_or_default());
        Ok(Some(AddressSpace {
            page_table: guest
                .read_u64(mm + o.mm_struct_pgd)?
                .wrapping_sub(o.page_offset as u64),
            heap: guest.read_u64(mm + o.mm_struct_start_brk)?
                ..guest.read_u64(mm + o.mm_struct_brk)?,
            stack_start: guest.read_u64(mm + o.mm_struct_start_stack)?,
            vmas,
        }))
    }

    /// What the process has at `address`; `copied` where the page there is
    /// anonymous to the kernel (a file mapping's page then is a copy).
    pub fn region(&self, address: u64, copied: bool) -> Region {
        if self.heap.contains(&address) {
            return Region::Heap;
        }
        let Some(vmas) = &self.vmas else {
            let stack =
                self.stack_start.saturating_sub(STACK_REACH)..self.stack_start + STACK_TOP_REACH;
            return if stack.contains(&address) {
                Region::Stack
            } else {
                Region::Anonymous
            };
        };
        let Some(vma) = vmas.iter().find(|vma| vma.range.contains(&address)) else {
            return Region::Unmapped;
        };
        match &vma.file {
            _ if vma.range.contains(&self.stack_start) => Region::Stack,
            None => Region::Anonymous,
            Some((path, start)) => {
                let (path, offset) = (path.clone(), start + (address - vma.range.start));
                if copied {
                    Region::FileCopy { path, offset }
                } else {
                    Region::File { path, offset }
                }
            }
        }
    }

    /// The 8 bytes at user `address`, through the process's page tables.
    pub fn read_u64(&self, guest: &Guest, address: u64) -> Result<u64, Unmapped> {
        let mut bytes = [0u8; 8];
        guest
            .view
            .read_under(self.page_table, address, &mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }
}

/// The mappings of `mm`, in address order, with their files named as
/// `task` sees them. Entries that are not this memory map's VMAs (a
/// stale slot) are left out.
fn read_vmas(
    guest: &Guest,
    offsets: &VmaOffsets,
    task: u64,
    mm: u64,
) -> Result<Vec<Vma>, Unmapped> {
    let o = offsets;
    let tree = MapleTree::new(&o.maple, |address| guest.read_u64(address));
    let mut paths: HashMap<u64, String> = HashMap::new();
    let mut vmas = Vec::new();
    for vma in tree.entries(mm + o.mm_struct_mm_mt)? {
        let range = guest.read_u64(vma + o.vm_area_struct_vm_start)?
            ..guest.read_u64(vma + o.vm_area_struct_vm_end)?;
        let plausible = range.start < range.end
            && range.end <= USER_END
            && (range.start | range.end) % PAGE == 0;
        if !plausible || guest.read_u64(vma + o.vm_area_struct_vm_mm)? != mm {
            continue;
        }
        let file = guest.read_u64(vma + o.vm_area_struct_vm_file)?;
        let file = if file == 0 {
            None
        } else {
            let path = match paths.get(&file) {
                Some(path) => path.clone(),
                None => {
                    let path = guest.file_path(task, file)?;
                    paths.insert(file, path.clone());
                    path
                }
            };
            Some((
                path,
                guest.read_u64(vma + o.vm_area_struct_vm_pgoff)? * PAGE,
            ))
        };
        vmas.push(Vma { range, file });
    }
    vmas.sort_by_key(|vma| vma.range.start);
    Ok(vmas)
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Region::Heap => f.write_str("heap"),
            Region::Stack => f.write_str("stack"),
            Region::File { path, offset } => write!(f, "file {path}+{offset:#x}"),
            Region::FileCopy { path, offset } => {
                write!(f, "private copy of file {path}+{offset:#x}")
            }
            Region::Anonymous => f.write_str("anonymous"),
            Region::Unmapped => f.write_str("unmapped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(vmas: Option<Vec<Vma>>) -> AddressSpace {
        AddressSpace {
            page_table: 0,
            heap: 0x60_0000..0x62_0000,
            stack_start: 0x7fff_f000,
            vmas,
        }
    }

    #[test]
    fn an_address_is_named_by_the_mapping_that_holds_it() {
        let file = |start| Some(("/bin/prog".to_owned(), start));
        let space = space(Some(vec![
            Vma {
                range: 0x40_0000..0x40_2000,
                file: file(0x1000),
            },
            Vma {
                range: 0x60_0000..0x62_0000,
                file: None,
            },
            Vma {
                range: 0x7000_0000..0x7001_0000,
                file: None,
            },
            Vma {
                range: 0x7ffd_0000..0x8000_0000,
                file: None,
            },
        ]));
        let in_file = |offset| Region::File {
            path: "/bin/prog".into(),
            offset,
        };
        assert_eq!(space.region(0x40_1010, false), in_file(0x2010));
        assert_eq!(
            space.region(0x40_0000, true),
            Region::FileCopy {
                path: "/bin/prog".into(),
                offset: 0x1000
            }
        );
        assert_eq!(space.region(0x61_0000, false), Region::Heap);
        assert_eq!(space.region(0x7000_8000, false), Region::Anonymous);
        assert_eq!(space.region(0x7ffe_0000, false), Region::Stack);
        assert_eq!(space.region(0x50_0000, false), Region::Unmapped);
        assert_eq!(in_file(0x2010).to_string(), "file /bin/prog+0x2010");
    }

    #[test]
    fn a_profile_from_before_vmas_reads_without_them() {
        let old = br#"{"page_offset": -4096, "mm_struct_pgd": 48, "mm_struct_start_brk": 248,
            "mm_struct_brk": 256, "mm_struct_start_stack": 264, "mm_struct_mm_mt": 64}"#;
        let offsets: SpaceOffsets = serde_json::from_slice(old).unwrap();
        assert!(offsets.vmas.is_none());
        assert_eq!(offsets.page_offset, -4096);
    }

    #[test]
    fn without_vmas_the_heap_and_stack_bounds_name_an_address() {
        let space = space(None);
        assert_eq!(space.region(0x61_0000, false), Region::Heap);
        assert_eq!(space.region(0x7fff_0000, false), Region::Stack);
        assert_eq!(space.region(0x40_0000, false), Region::Anonymous);
    }
}
