//! Who owns a guest-physical page, read from the guest kernel's own
//! structures at a stop: the processes that map it (pid, name, virtual
//! address, and what they have there: their heap, stack, a file at an
//! offset, a private copy of a file's page, or anonymous memory), and what the kernel uses it for (its image, a file's page
//! cache, a slab, a page table, or nothing: free). A state check that
//! finds memory differing names these for each page.
//!
//! Reads go through the kernel's direct map, which every address space
//! shares, so whatever process stopped the guest, every process's page
//! tables and every `struct page` can be read.

use std::collections::BTreeMap;

use object::{Object, ObjectSymbol};
use provm_vmm::paging::Unmapped;
use serde::{Deserialize, Serialize};

use crate::address_space::{AddressSpace, Region, SpaceOffsets};
use crate::guest::{Guest, Task};
use crate::profile::{ProfileError, START_KERNEL_MAP};

/// The profile's offsets for page ownership: kernels built by provm
/// from this one on (traces before it have no such profile).
#[derive(Clone, Debug, Deserialize)]
pub struct PageOffsets {
    #[serde(flatten)]
    pub space: SpaceOffsets,
    pub task_struct_tasks: u64,
    pub section_size_bits: u64,
    pub sections_per_root: u64,
    pub mem_section_size: u64,
    pub mem_section_section_mem_map: u64,
    /// Negative as the profile writes it (the assembler's signed
    /// immediates), as is `page_type_base`.
    pub section_map_mask: i64,
    pub page_size: u64,
    pub page_flags: u64,
    pub page_mapping: u64,
    pub page_index: u64,
    pub page_page_type: u64,
    pub pg_slab: u64,
    pub page_type_base: i64,
    pub pg_buddy: u64,
    pub pg_table: u64,
    pub page_mapping_anon: u64,
    pub address_space_host: u64,
    pub inode_i_dentry: u64,
    pub inode_i_sb: u64,
    pub super_block_s_id: u64,
    pub dentry_d_alias: u64,
    pub dentry_d_parent: u64,
    pub dentry_d_name: u64,
    pub qstr_name: u64,
}

/// The most processes, and parent directories, a walk follows.
const MAX_WALK: usize = 4096;
const PAGE: u64 = 4096;
const PRESENT: u64 = 1;
const LARGE_PAGE: u64 = 1 << 7;
const ADDRESS_MASK: u64 = 0x000f_ffff_ffff_f000;
/// The user half of an address space: PML4 entries below this.
const USER_PML4_ENTRIES: u64 = 256;

/// A live process that maps the page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mapper {
    pub pid: i32,
    pub comm: String,
    /// The virtual address it maps the page at.
    pub address: u64,
    pub region: Region,
}

/// What the kernel uses a page for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum KernelUse {
    /// The kernel's image, at this symbol (and offset into it).
    Image {
        symbol: String,
    },
    /// A page of a file: its page cache, or a tmpfs file's memory.
    File {
        /// Its path from the root of its file system.
        path: String,
        /// The file system's id (`tmpfs`, a device name).
        filesystem: String,
        offset: u64,
    },
    /// Anonymous memory of a process (mapped or not).
    Anonymous,
    /// Kernel objects (the slab allocator).
    Slab,
    PageTable,
    /// Free: in the page allocator, holding what its last user left.
    Free,
    /// In use, by nothing the page's structure names.
    Other,
}

/// Who owns one page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PageOwner {
    pub kernel: KernelUse,
    pub mapped_by: Vec<Mapper>,
}

/// The kernel's symbol table, for naming addresses in its image.
pub struct KernelSymbols {
    /// Address to name, of every function and object.
    by_address: BTreeMap<u64, String>,
    /// The image's physical addresses (`_text` to `_end`).
    image: std::ops::Range<u64>,
}

impl KernelSymbols {
    pub fn from_vmlinux(vmlinux: &[u8]) -> Result<Self, ProfileError> {
        let elf = object::File::parse(vmlinux)?;
        let by_address: BTreeMap<u64, String> = elf
            .symbols()
            .filter(|symbol| symbol.address() >= START_KERNEL_MAP)
            .filter_map(|symbol| Some((symbol.address(), symbol.name().ok()?.to_owned())))
            .collect();
        let mut symbols = KernelSymbols {
            by_address,
            image: 0..0,
        };
        symbols.image = symbols.address("_text")? - START_KERNEL_MAP
            ..symbols.address("_end")? - START_KERNEL_MAP;
        Ok(symbols)
    }

    fn address(&self, name: &'static str) -> Result<u64, ProfileError> {
        self.by_address
            .iter()
            .find(|(_, symbol)| *symbol == name)
            .map(|(address, _)| *address)
            .ok_or(ProfileError::MissingSymbol(name))
    }

    /// The symbol at or before the image's physical address `physical`,
    /// if the image holds it.
    fn in_image(&self, physical: u64) -> Option<String> {
        if !self.image.contains(&physical) {
            return None;
        }
        let virt = physical + START_KERNEL_MAP;
        let (address, name) = self.by_address.range(..=virt).next_back()?;
        Some(format!("{name}+{:#x}", virt - address))
    }
}

/// Names the owners of pages, reading the guest at one stop.
pub struct PageOwners<'a> {
    guest: Guest<'a>,
    offsets: PageOffsets,
    symbols: &'a KernelSymbols,
    mem_section: u64,
    /// Each live process: who it is, and its address space.
    processes: Vec<(Task, AddressSpace)>,
    /// Each live process's user pages: physical page to (index in
    /// `processes`, virtual address).
    mapped: BTreeMap<u64, Vec<(usize, u64)>>,
}

impl<'a> PageOwners<'a> {
    /// Walks every live process's page tables once; `None` where the
    /// trace's kernel profile predates page ownership.
    pub fn new(
        guest: Guest<'a>,
        profile_json: &[u8],
        symbols: &'a KernelSymbols,
    ) -> Result<Option<Self>, ProfileError> {
        let Ok(offsets) = serde_json::from_slice::<PageOffsets>(profile_json) else {
            return Ok(None);
        };
        let mut owners = PageOwners {
            guest,
            offsets,
            symbols,
            mem_section: symbols.address("mem_section")?,
            processes: Vec::new(),
            mapped: BTreeMap::new(),
        };
        let init_task = symbols.address("init_task")?;
        // Unreadable processes are left out: the guest stopped anywhere.
        let _ = owners.map_processes(init_task);
        Ok(Some(owners))
    }

    /// Who owns the page at guest-physical `address`.
    pub fn owner(&self, address: u64) -> PageOwner {
        let page = address & !(PAGE - 1);
        // The image's init sections are freed at boot: its structure says
        // first what a page is now.
        let kernel = match (self.kernel_use(page), self.symbols.in_image(page)) {
            (Ok(KernelUse::Other) | Err(_), Some(symbol)) => KernelUse::Image { symbol },
            (Ok(used), _) => used,
            (Err(_), None) => KernelUse::Other,
        };
        let copied = kernel == KernelUse::Anonymous;
        let mapped_by = self
            .mapped
            .get(&page)
            .into_iter()
            .flatten()
            .map(|&(process, address)| {
                let (task, space) = &self.processes[process];
                let region = match (space.region(address, copied), &kernel) {
                    // A profile without VMAs names no file: the page does.
                    (Region::Anonymous, KernelUse::File { path, offset, .. }) => Region::File {
                        path: path.clone(),
                        offset: *offset,
                    },
                    (region, _) => region,
                };
                Mapper {
                    pid: task.pid,
                    comm: task.comm.clone(),
                    address,
                    region,
                }
            })
            .collect();
        PageOwner { kernel, mapped_by }
    }

    /// `len` bytes of guest-physical memory at `address`.
    pub fn physical(&self, address: u64, len: usize) -> Result<Vec<u8>, Unmapped> {
        self.guest.read_bytes(
            (self.offsets.space.page_offset as u64).wrapping_add(address),
            len,
        )
    }

    fn read_u64(&self, virt: u64) -> Result<u64, Unmapped> {
        self.guest.read_u64(virt)
    }

    fn read_u32(&self, virt: u64) -> Result<u32, Unmapped> {
        let bytes = self.guest.read_bytes(virt, 4)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    /// The `struct page` of the page at `address` (sparse memory model,
    /// SPARSEMEM_EXTREME: `mem_section` points at the roots).
    fn struct_page(&self, address: u64) -> Result<u64, Unmapped> {
        let o = &self.offsets;
        let pfn = address / PAGE;
        let section = pfn >> (o.section_size_bits - 12);
        let roots = self.read_u64(self.mem_section)?;
        let root = self.read_u64(roots + 8 * (section / o.sections_per_root))?;
        let entry = root + (section % o.sections_per_root) * o.mem_section_size;
        let map = self.read_u64(entry + o.mem_section_section_mem_map)? & o.section_map_mask as u64;
        Ok(map.wrapping_add(pfn * o.page_size))
    }

    fn kernel_use(&self, address: u64) -> Result<KernelUse, Unmapped> {
        let o = &self.offsets;
        let page = self.struct_page(address)?;
        let page_type = self.read_u32(page + o.page_page_type)?;
        let base = o.page_type_base as u32;
        let typed = |flag: u64| page_type & (base | flag as u32) == base;
        if typed(o.pg_buddy) {
            return Ok(KernelUse::Free);
        }
        if typed(o.pg_table) {
            return Ok(KernelUse::PageTable);
        }
        if self.read_u64(page + o.page_flags)? & (1 << o.pg_slab) != 0 {
            return Ok(KernelUse::Slab);
        }
        let mapping = self.read_u64(page + o.page_mapping)?;
        if mapping == 0 {
            return Ok(KernelUse::Other);
        }
        if mapping & o.page_mapping_anon != 0 {
            return Ok(KernelUse::Anonymous);
        }
        let inode = self.read_u64(mapping + o.address_space_host)?;
        let sb = self.read_u64(inode + o.inode_i_sb)?;
        let filesystem = self.guest.read_c_string(sb + o.super_block_s_id)?;
        Ok(KernelUse::File {
            path: self.inode_path(inode)?,
            filesystem,
            offset: self.read_u64(page + o.page_index)? * PAGE,
        })
    }

    /// The path of `inode` from its file system's root, through its first
    /// dentry; `(deleted)` for an inode no name links to.
    fn inode_path(&self, inode: u64) -> Result<String, Unmapped> {
        let o = &self.offsets;
        let first = self.read_u64(inode + o.inode_i_dentry)?;
        if first == 0 {
            return Ok("(deleted)".into());
        }
        let mut dentry = first - o.dentry_d_alias;
        let mut names = Vec::new();
        for _ in 0..MAX_WALK {
            let parent = self.read_u64(dentry + o.dentry_d_parent)?;
            if parent == dentry {
                break;
            }
            let name = self.read_u64(dentry + o.dentry_d_name + o.qstr_name)?;
            names.push(self.guest.read_c_string(name)?);
            dentry = parent;
        }
        names.reverse();
        Ok(format!("/{}", names.join("/")))
    }

    /// Notes every user page of every live process (the `tasks` list,
    /// from `init_task`: thread group leaders only).
    fn map_processes(&mut self, init_task: u64) -> Result<(), Unmapped> {
        let o = self.offsets.clone();
        let head = init_task + o.task_struct_tasks;
        let mut link = self.read_u64(head)?;
        for _ in 0..MAX_WALK {
            if link == head {
                break;
            }
            let task = link - o.task_struct_tasks;
            link = self.read_u64(link)?;
            let (Ok(identity), Ok(Some(space))) = (
                self.guest.task(task),
                AddressSpace::of_task(&self.guest, &o.space, task),
            ) else {
                continue;
            };
            let mut pages = Vec::new();
            self.walk(space.page_table, 4, 0, &mut pages)?;
            for (physical, address) in pages {
                self.mapped
                    .entry(physical)
                    .or_default()
                    .push((self.processes.len(), address));
            }
            self.processes.push((identity, space));
        }
        Ok(())
    }

    /// Collects (physical page, virtual address) of every present user
    /// page under the table at physical `table`, of paging `level`.
    fn walk(
        &self,
        table: u64,
        level: u32,
        base: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<(), Unmapped> {
        let entries = self.physical(table & ADDRESS_MASK, PAGE as usize)?;
        let shift = 12 + 9 * (level - 1);
        let count = if level == 4 { USER_PML4_ENTRIES } else { 512 };
        for index in 0..count {
            let at = index as usize * 8;
            let entry = u64::from_le_bytes(entries[at..at + 8].try_into().expect("8 bytes"));
            if entry & PRESENT == 0 {
                continue;
            }
            let virt = base | (index << shift);
            let target = entry & ADDRESS_MASK;
            if level == 1 || (level <= 3 && entry & LARGE_PAGE != 0) {
                for page in 0..(1u64 << (shift - 12)) {
                    out.push((target + page * PAGE, virt + page * PAGE));
                }
            } else {
                self.walk(target, level - 1, virt, out)?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for PageOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kernel {
            KernelUse::Image { symbol } => write!(f, "the kernel's image, at {symbol}")?,
            KernelUse::File {
                path,
                filesystem,
                offset,
            } => write!(f, "the file {path} on {filesystem}, at offset {offset:#x}")?,
            KernelUse::Anonymous => f.write_str("anonymous memory")?,
            KernelUse::Slab => f.write_str("kernel objects (slab)")?,
            KernelUse::PageTable => f.write_str("a page table")?,
            KernelUse::Free => {
                f.write_str("free memory (what its last owner left; no live process maps it)")?
            }
            KernelUse::Other => f.write_str("kernel memory")?,
        }
        for mapper in &self.mapped_by {
            write!(
                f,
                "; mapped by pid {} ({}) at {:#x} ({})",
                mapper.pid, mapper.comm, mapper.address, mapper.region
            )?;
        }
        Ok(())
    }
}
