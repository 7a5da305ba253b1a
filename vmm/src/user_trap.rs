//! Stopping guest user mode at one instruction on a host whose KVM stops
//! it at no breakpoint (PVM: ring 3 runs natively, and only the emulated
//! ring 0 traps; `guest_debug`), as a replay must at a preemption the
//! recorder made in user code (`preemption`).
//!
//! The guest's own exception does it: an `int3` written over the
//! instruction's first byte traps into the guest kernel, and a hardware
//! breakpoint on the kernel's `#BP` handler, which is ring 0, stops the
//! guest there before the handler has run. The user's registers are
//! still live, but for RIP, RSP and RFLAGS, which the CPU pushed in the
//! frame the handler stands on (`EntryFrame`). The guest is then sent
//! back where it was as if it had never trapped: the frame's RIP on the
//! instruction again, and an IRETQ written over the handler's first bytes
//! for the guest to execute, with an interrupt-window exit asked for,
//! which KVM makes at the first instruction boundary in user mode, before
//! the instruction runs: a stop in user mode at the instruction, the
//! VMM's to act on. A pass that is not the instance sought is stepped
//! over with `int3`s on every place the instruction can go next
//! (`breakpoint_step::user_successors`), the way debuggers step without
//! hardware stepping: a trap flag would raise a `#DB` in the guest, whose
//! delivery writes the guest's DR6 and its debug stack.
//!
//! The bytes written over guest code are there only while the guest runs
//! (`Patches`): nothing that looks at a stopped guest sees them. What the
//! trap leaves behind is its frame, at the top of the kernel's entry
//! stack, over the frame of the guest's last entry from user mode. The
//! interrupt delivered at the instance writes the same 40 bytes with the
//! same values but RIP, so a replay that goes on from there has the
//! recording's memory; a pass stepped over leaves it in a process that
//! enters the kernel again before another runs user code on the vCPU,
//! which writes it again. The instance's digest leaves those bytes out
//! (`preemption::digest`).

use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;
use crate::paging::{self, Unmapped};

/// The breakpoint instruction, and its exception's vector.
pub const INT3: u8 = 0xcc;
pub const BREAKPOINT_VECTOR: u8 = 3;
/// `iretq`: REX.W IRET.
const IRETQ: [u8; 2] = [0x48, 0xcf];

/// The frame the CPU pushes entering ring 0 from ring 3, from the lowest
/// address: RIP, CS, RFLAGS, RSP, SS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryFrame {
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

impl EntryFrame {
    const SIZE: usize = 40;

    /// The frame at `at` (the handler's RSP), through the page tables at
    /// `cr3`.
    pub fn read(memory: &GuestMemory, cr3: u64, at: u64) -> Result<Self, Unmapped> {
        let mut bytes = [0u8; Self::SIZE];
        paging::read(memory, cr3, at, &mut bytes)?;
        let word =
            |index: usize| u64::from_le_bytes(bytes[index * 8..index * 8 + 8].try_into().unwrap());
        Ok(EntryFrame {
            rip: word(0),
            cs: word(1),
            rflags: word(2),
            rsp: word(3),
            ss: word(4),
        })
    }

    /// Writes RIP back at `at`: the rest the CPU wrote stays.
    pub fn write_rip(memory: &GuestMemory, cr3: u64, at: u64, rip: u64) -> Result<(), Unmapped> {
        write(memory, cr3, at, &rip.to_le_bytes())
    }

    /// Whether the CPU came from user mode (CS's privilege level 3).
    pub fn from_user_mode(&self) -> bool {
        self.cs & 3 == 3
    }

    /// The address of the `int3` that raised this trap, which leaves RIP
    /// past its one byte.
    pub fn int3_address(&self) -> u64 {
        self.rip.wrapping_sub(1)
    }
}

/// Writes `bytes` at guest virtual `at` under `cr3` (within one page).
fn write(memory: &GuestMemory, cr3: u64, at: u64, bytes: &[u8]) -> Result<(), Unmapped> {
    let physical = paging::translate(memory, cr3, at)?;
    memory
        .write_slice(bytes, GuestAddress(physical))
        .map_err(|_| Unmapped(at))
}

/// Bytes provm writes over guest code while the guest runs (`lay`) and
/// takes off whenever it stops (`lift`), so that nothing else sees them:
/// not a state check, a snapshot or a digest at an exit, nor a debugger.
#[derive(Debug, Default)]
pub struct Patches {
    patches: Vec<Patch>,
}

#[derive(Debug)]
struct Patch {
    /// Guest physical: the process whose tables mapped it need not be
    /// the one running when it is laid.
    physical: u64,
    bytes: Vec<u8>,
    /// What it replaced, while laid.
    replaced: Option<Vec<u8>>,
}

impl Patches {
    /// Adds `bytes` at guest physical `physical`, unless a patch starts
    /// there already; laid at the next `lay`.
    pub fn add_physical(&mut self, physical: u64, bytes: &[u8]) {
        if !self.covers(physical) {
            self.patches.push(Patch {
                physical,
                bytes: bytes.to_vec(),
                replaced: None,
            });
        }
    }

    /// Adds `bytes` at guest virtual `at`, under the tables at `cr3`.
    /// Returns the guest physical address they go to.
    pub fn add(
        &mut self,
        memory: &GuestMemory,
        cr3: u64,
        at: u64,
        bytes: &[u8],
    ) -> Result<u64, Unmapped> {
        let physical = paging::translate(memory, cr3, at)?;
        if (physical % 4096) as usize + bytes.len() > 4096 {
            return Err(Unmapped(at));
        }
        self.add_physical(physical, bytes);
        Ok(physical)
    }

    /// An `int3` at `at` (`add`).
    pub fn add_int3(&mut self, memory: &GuestMemory, cr3: u64, at: u64) -> Result<u64, Unmapped> {
        self.add(memory, cr3, at, &[INT3])
    }

    /// An `iretq` at `at` (`add`).
    pub fn add_iretq(&mut self, memory: &GuestMemory, cr3: u64, at: u64) -> Result<u64, Unmapped> {
        self.add(memory, cr3, at, &IRETQ)
    }

    /// Forgets the patch at guest physical `physical` (lifted).
    pub fn remove(&mut self, physical: u64) {
        self.patches.retain(|patch| patch.physical != physical);
    }

    /// Forgets every patch (lifted).
    pub fn clear(&mut self) {
        debug_assert!(self.patches.iter().all(|patch| patch.replaced.is_none()));
        self.patches.clear();
    }

    /// Whether a patch starts at guest physical `physical`.
    pub fn covers(&self, physical: u64) -> bool {
        self.patches.iter().any(|patch| patch.physical == physical)
    }

    /// Writes the patches, keeping what they replace.
    pub fn lay(&mut self, memory: &GuestMemory) {
        for patch in self
            .patches
            .iter_mut()
            .filter(|patch| patch.replaced.is_none())
        {
            let mut replaced = vec![0; patch.bytes.len()];
            let at = GuestAddress(patch.physical);
            // In RAM: translated through the guest's tables, or checked
            // when added.
            if memory.read_slice(&mut replaced, at).is_ok()
                && memory.write_slice(&patch.bytes, at).is_ok()
            {
                patch.replaced = Some(replaced);
            }
        }
    }

    /// Puts back what the patches replaced, newest first, where the
    /// guest has not written over them meanwhile.
    pub fn lift(&mut self, memory: &GuestMemory) {
        for patch in self.patches.iter_mut().rev() {
            let Some(replaced) = patch.replaced.take() else {
                continue;
            };
            let at = GuestAddress(patch.physical);
            let mut now = vec![0; patch.bytes.len()];
            if memory.read_slice(&mut now, at).is_ok() && now == patch.bytes {
                let _ = memory.write_slice(&replaced, at);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paging::test_tables::{guest, CR3, KERNEL};

    #[test]
    fn a_frame_reads_in_the_cpus_order_and_names_its_int3() {
        let memory = guest();
        for (index, word) in [0x401235u64, 0x33, 0x246, 0x7ff0, 0x2b].iter().enumerate() {
            memory
                .write_obj(*word, GuestAddress(0x10_0800 + 8 * index as u64))
                .unwrap();
        }
        let frame = EntryFrame::read(&memory, CR3, KERNEL + 0x800).unwrap();
        assert_eq!(
            frame,
            EntryFrame {
                rip: 0x401235,
                cs: 0x33,
                rflags: 0x246,
                rsp: 0x7ff0,
                ss: 0x2b
            }
        );
        assert!(frame.from_user_mode());
        assert_eq!(frame.int3_address(), 0x401234);
        EntryFrame::write_rip(&memory, CR3, KERNEL + 0x800, 0x401234).unwrap();
        assert_eq!(
            EntryFrame::read(&memory, CR3, KERNEL + 0x800).unwrap().rip,
            0x401234
        );
        assert!(EntryFrame::read(&memory, CR3, KERNEL + 0x2000).is_err());
    }

    #[test]
    fn patches_are_in_memory_only_while_laid() {
        let memory = guest();
        memory
            .write_slice(&[0x90, 0x41, 0x42], GuestAddress(0x40_0100))
            .unwrap();
        let read = || {
            let mut now = [0u8; 3];
            memory
                .read_slice(&mut now, GuestAddress(0x40_0100))
                .unwrap();
            now
        };
        let mut patches = Patches::default();
        assert_eq!(patches.add_iretq(&memory, CR3, 0x4020_0100), Ok(0x40_0100));
        assert_eq!(patches.add_int3(&memory, CR3, 0x4020_0102), Ok(0x40_0102));
        // One patch a place: a second at the same address is not stacked.
        patches.add_int3(&memory, CR3, 0x4020_0102).unwrap();
        assert_eq!(read(), [0x90, 0x41, 0x42]);
        patches.lay(&memory);
        assert_eq!(read(), [0x48, 0xcf, INT3]);
        patches.lift(&memory);
        assert_eq!(read(), [0x90, 0x41, 0x42]);
        assert!(patches.covers(0x40_0102) && !patches.covers(0x40_0101));
        // The guest wrote over a patch while it was laid: its byte stays.
        patches.lay(&memory);
        memory.write_obj(0x55u8, GuestAddress(0x40_0102)).unwrap();
        patches.lift(&memory);
        assert_eq!(read(), [0x90, 0x41, 0x55]);
        patches.remove(0x40_0100);
        patches.lay(&memory);
        assert_eq!(read(), [0x90, 0x41, INT3]);
        patches.lift(&memory);
        patches.clear();
        assert!(!patches.covers(0x40_0102));
        // Across a page boundary, or unmapped: refused.
        assert!(patches.add_iretq(&memory, CR3, 0x4020_0fff).is_err());
        assert!(patches.add_int3(&memory, CR3, 0x5000).is_err());
    }
}
