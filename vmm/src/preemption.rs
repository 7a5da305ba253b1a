//! Preemption without an instruction counter. A recording delivers
//! interrupts at VM exits only, where a replay finds them again, and guest
//! code that computes without exits makes none: a thread spinning on a
//! flag that another sets would spin for ever, and a vCPU computing in user
//! space would hold the others. So the recorder preempts guest code that
//! has computed for a quantum without an exit: at a kick (`vcpu::Kicker`)
//! it logs the guest's state as an exit of its own (`Exit::Preempted`) and
//! delivers what waited, as after any exit.
//!
//! A replay must stop the guest at the same instruction instance, and no
//! counter says which pass through a loop that was: rr counts branches
//! with the PMU, which many hosts (clouds, nested VMs) do not give a
//! guest. The state says it instead. The place (RIP and general
//! registers) is logged as every exit's; a loop whose registers repeat at
//! every pass (one that counts in memory) differs only in memory, so the
//! instance digests the rest: the system registers that tell processes
//! apart (CR3, FS and GS bases), the vector registers, and the bytes of
//! every page written since the last preemption, KVM's dirty log (a
//! superset of what the guest wrote since its last exit: the pages it did
//! not write are the same at every pass). Two passes with equal digests
//! are the same machine state, which has the same future: a replay may
//! take either. It runs the guest to the RIP with a hardware breakpoint and
//! takes the first stop whose state digests so (`logged_stop`).
//!
//! Which instances: a state the kicks of one stretch without exits saw
//! twice is a loop that never ends by itself, and its search from the last
//! exit ends at the loop's first pass in that state (`Repeats`). Any other
//! state is a computation that may end, whose search from the last exit
//! would stop at every pass through the place; the recorder logs how long
//! the guest computed before it, and the replay runs freely for most of
//! that before it arms the breakpoint, rolling back where it ran past
//! (`late_arming`, `rollback`). Only where the recorder is asked to
//! (`Seam::preempts_computations`, `record --preempt-computations`: the
//! search after a free run that lands far from the instance still stops
//! at every pass), and on hosts that stop guest user mode at breakpoints:
//! on PVM only the loops of the guest kernel are preempted.
//!
//! Not everywhere: the guest must be able to take an interrupt there
//! (interrupts on, no interrupt shadow, no event half-delivered), and a
//! breakpoint must be able to stop it there: not where RFLAGS.RF is set
//! (the instruction the guest returned to from a fault or an interrupt,
//! whose breakpoint the CPU suppresses once; seen on the SVM test bed),
//! nor in a repeated string instruction, which a breakpoint stops only
//! before its first iteration. The next kick tries again. PVM stops no guest user
//! code at a breakpoint (`guest_debug`), so a recording there preempts
//! only its kernel.
//!
//! What is not digested: AVX-512's registers (their place in the XSAVE
//! area is the host CPU's), and the x87 unit's last-instruction pointers,
//! which AMD's FXSAVE leaves out. A pass that differs from the logged one
//! there alone would be taken for it, and the replay would diverge at its
//! next exit, saying so.

use std::collections::HashSet;

use iced_x86::{Decoder, DecoderOptions};
use kvm_bindings::{kvm_sregs, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use xxhash_rust::xxh3::Xxh3;

use crate::memory::GuestMemory;
use crate::paging;
use crate::seam::Place;
use crate::vcpu::{self, Vcpu, VcpuError};

pub mod chaos_quanta;
pub mod late_arming;
pub mod rollback;

const PAGE: u64 = 4096;
/// EFER's long mode active bit.
const EFER_LMA: u64 = 1 << 10;

/// The calling thread's CPU time, in ns: on the vCPU thread, around
/// KVM_RUN, the time the guest computed (which a host's load does not
/// stretch as it does wall time).
pub fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; the clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Has KVM log the pages the guest writes, in every slot of `memory`
/// (registered by `memory::register`), from now on.
pub fn log_written_pages(vm: &VmFd, memory: &GuestMemory) -> Result<(), kvm_ioctls::Error> {
    crate::memory::register_with_flags(vm, memory, KVM_MEM_LOG_DIRTY_PAGES)
}

/// The guest pages written since the last preemption: KVM's dirty log,
/// gathered where a preemption is considered (KVM keeps the rest).
#[derive(Default)]
pub struct WrittenPages {
    /// Per slot of `memory::register`'s: its first page number, and a bit
    /// per page from there.
    slots: Vec<(u64, Vec<u64>)>,
}

impl WrittenPages {
    /// Adds the pages KVM logged as written since it was last asked.
    pub fn gather(&mut self, vm: &VmFd, memory: &GuestMemory) -> Result<(), kvm_ioctls::Error> {
        for (slot, region) in memory.iter().enumerate() {
            let logged = vm.get_dirty_log(slot as u32, region.len() as usize)?;
            if self.slots.len() <= slot {
                self.slots
                    .push((region.start_addr().0 / PAGE, vec![0; logged.len()]));
            }
            for (gathered, word) in self.slots[slot].1.iter_mut().zip(logged) {
                *gathered |= word;
            }
        }
        Ok(())
    }

    /// The pages gathered, as ascending runs of page numbers (first, count).
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (first_page, bitmap) in &self.slots {
            for page in pages_set(bitmap).map(|page| first_page + page as u64) {
                match runs.last_mut() {
                    Some((first, count)) if *first + *count == page => *count += 1,
                    _ => runs.push((page, 1)),
                }
            }
        }
        runs
    }

    /// A preemption was logged: the next one digests what is written after.
    pub fn clear(&mut self) {
        for (_, bitmap) in &mut self.slots {
            bitmap.fill(0);
        }
    }
}

/// The page numbers a bitmap (a bit per page, from bit 0 of word 0, as
/// KVM's dirty log and vm-memory's bitmap have them) sets, ascending.
pub(crate) fn pages_set(bitmap: &[u64]) -> impl Iterator<Item = usize> + '_ {
    bitmap.iter().enumerate().flat_map(|(index, &word)| {
        let mut bits = word;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let bit = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                index * 64 + bit
            })
        })
    })
}

const MAX_PLACES: usize = 1 << 16;

/// The states the kicks of one stretch without exits found the guest in.
/// One seen twice is a loop that never ends by itself: the guest went from
/// that state back to it, and with no input on the way an equal state has
/// an equal future. There the replay's search starts at the last exit and
/// ends at the loop's first pass in that state, however long the recording
/// spun; elsewhere it starts late (`late_arming`).
#[derive(Default)]
pub struct Repeats {
    /// The places seen: only a place seen before is digested.
    places: HashSet<Place>,
    states: HashSet<(Place, u64)>,
}

impl Repeats {
    /// Notes `place`; whether it was seen before in this stretch (only
    /// then is its state worth comparing). At most
    /// `MAX_PLACES` are kept: a stretch with more starts again, so that
    /// memory stays bounded in a computation of hours.
    pub fn place_seen_before(&mut self, place: Place) -> bool {
        if self.places.len() >= MAX_PLACES {
            *self = Repeats::default();
        }
        !self.places.insert(place)
    }

    /// Notes the state `digest` at `place`; whether it was seen before.
    pub fn state_seen_before(&mut self, place: Place, digest: u64) -> bool {
        !self.states.insert((place, digest))
    }

    /// The guest exited: a new stretch begins.
    pub fn exited(&mut self) {
        if !self.places.is_empty() {
            *self = Repeats::default();
        }
    }
}

/// Whether a replay's breakpoint finds the instruction the vCPU stands at
/// as the recording saw it: not a string instruction with a REP prefix,
/// which a stop part-way leaves at the same RIP and which then resumes
/// without a breakpoint stop, and not one that cannot be read (outside
/// long mode, an AP starting up, or unmapped) or decoded, which may be
/// one. Read through the guest's page tables (`paging`): KVM_TRANSLATE
/// refuses user pages under SMAP, and so a `rep movsb` in user code was
/// once preempted part-way on the SVM test bed, a place its replay never
/// found.
pub fn findable_instruction(
    vcpu: &Vcpu,
    memory: &GuestMemory,
    rip: u64,
) -> Result<bool, VcpuError> {
    let sregs = vcpu.system_registers()?;
    if sregs.efer & EFER_LMA == 0 {
        return Ok(false);
    }
    let code = paging::instruction_bytes(memory, sregs.cr3, rip);
    Ok(findable_code(&code, sregs.cs.l == 1))
}

/// Whether `code` (64-bit code, or 32-bit) begins with an instruction a
/// breakpoint finds as `findable_instruction` asks.
fn findable_code(code: &[u8], in_64_bit_code: bool) -> bool {
    let bitness = if in_64_bit_code { 64 } else { 32 };
    let instruction = Decoder::new(bitness, code, DecoderOptions::NONE).decode();
    !instruction.is_invalid() && !instruction.has_rep_prefix() && !instruction.has_repne_prefix()
}

/// The digest of the vCPU's state beyond its place, with the bytes of
/// `pages` (runs as `WrittenPages::runs` gives them): what tells one pass
/// through a place from another. A place in user mode (`user_mode`) is
/// digested without the kernel's entry frame (`entry_frame`), which a
/// replay that finds it with an `int3` has just written (`user_trap`).
pub fn digest(
    vcpu: &Vcpu,
    memory: &GuestMemory,
    pages: &[(u64, u64)],
    user_mode: bool,
) -> Result<u64, VcpuError> {
    let mut hash = Xxh3::new();
    let (sregs, xsave) = vcpu.system_and_vector_registers()?;
    let left_out = if user_mode {
        entry_frame(memory, &sregs)
    } else {
        Vec::new()
    };
    for word in [sregs.cr3, sregs.fs.base, sregs.gs.base] {
        hash.update(&word.to_le_bytes());
    }
    for range in VECTOR_STATE {
        // KVM's XSAVE area is in the standard, uncompacted form, in which KVM
        // puts a component's initial state where the guest has it in use
        // nowhere, so equal registers give equal bytes.
        hash.update(&vcpu::xsave_bytes(&xsave)[range]);
    }
    let mut page = [0u8; PAGE as usize];
    for &(first, count) in pages {
        for number in first..first + count {
            // A page the log names is in RAM: the log covers RAM's slots only.
            if memory
                .read_slice(&mut page, GuestAddress(number * PAGE))
                .is_ok()
            {
                for &(at, len) in &left_out {
                    if at / PAGE == number {
                        let offset = (at % PAGE) as usize;
                        page[offset..offset + len].fill(0);
                    }
                }
                hash.update(&page);
            }
        }
    }
    Ok(hash.digest())
}

/// Where the CPU pushes its frame (SS, RSP, RFLAGS, CS, RIP: 40 bytes)
/// entering the kernel from user mode: below the ring-0 stack pointer of
/// the TSS (RSP0, at byte 4), aligned down to 16 bytes. Linux's entry
/// stack, one per CPU, whose top the last such entry wrote. As guest
/// physical pieces (address, length), one per page it spans; none where
/// the tables do not map it.
fn entry_frame(memory: &GuestMemory, sregs: &kvm_sregs) -> Vec<(u64, usize)> {
    const FRAME: u64 = 40;
    let mut rsp0 = [0u8; 8];
    if paging::read(memory, sregs.cr3, sregs.tr.base + 4, &mut rsp0).is_err() {
        return Vec::new();
    }
    let top = u64::from_le_bytes(rsp0) & !0xf;
    let start = top.wrapping_sub(FRAME);
    let first = (PAGE - start % PAGE).min(FRAME);
    [(start, first), (start + first, FRAME - first)]
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .map(|(virt, len)| {
            paging::translate(memory, sregs.cr3, virt).map(|physical| (physical, len as usize))
        })
        .collect::<Result<_, _>>()
        .unwrap_or_default()
}

/// The parts of the XSAVE area digested: the x87 control, status and tag
/// words, MXCSR, ST0-ST7 and XMM0-XMM15 (the legacy area, less the last
/// instruction's pointers and opcode, which AMD does not save, and
/// MXCSR_MASK, the host CPU's), and YMM0-YMM15's upper halves (AVX, at its
/// architectural offset).
const VECTOR_STATE: [std::ops::Range<usize>; 4] = [0..6, 24..28, 32..416, 576..832];

#[cfg(test)]
mod tests {
    use super::*;

    /// An instruction with a REP prefix, and bytes that are no
    /// instruction (none could be read, or too few), are no place to
    /// preempt; an ordinary instruction is. Reading nothing once passed
    /// for "no REP prefix" (KVM_TRANSLATE under SMAP).
    #[test]
    fn only_a_whole_instruction_without_a_rep_prefix_is_findable() {
        let rep_movsb = [0xf3, 0xa4];
        let repne_scasb = [0xf2, 0xae];
        let incq_r8 = [0x49, 0xff, 0x00];
        assert!(!findable_code(&rep_movsb, true));
        assert!(!findable_code(&repne_scasb, true));
        assert!(!findable_code(&[], true));
        assert!(!findable_code(&incq_r8[..2], true));
        assert!(findable_code(&incq_r8, true));
        assert!(findable_code(&[0x90], false));
    }

    #[test]
    fn a_bitmaps_pages_come_out_ascending_across_words() {
        assert_eq!(pages_set(&[]).count(), 0);
        assert_eq!(
            pages_set(&[0b1001, 0, 1 << 63 | 1]).collect::<Vec<_>>(),
            [0, 3, 128, 191]
        );
    }

    #[test]
    fn written_pages_come_out_as_runs_across_words_and_slots() {
        let mut written = WrittenPages {
            slots: vec![(0, vec![0b1110, 1 << 63]), (0x100, vec![0, 1])],
        };
        assert_eq!(written.runs(), [(1, 3), (127, 1), (0x140, 1)]);
        written.slots[1].1[0] = 1 << 63;
        // Page 0x13f and 0x140 are neighbours across a word.
        assert_eq!(written.runs(), [(1, 3), (127, 1), (0x13f, 2)]);
        written.clear();
        assert_eq!(written.runs(), []);
    }

    #[test]
    fn the_entry_frame_is_the_40_bytes_below_rsp0_aligned_in_each_page() {
        use crate::paging::test_tables::{guest, CR3, KERNEL};
        let memory = guest();
        let tss = KERNEL + 0x100;
        let mut sregs = kvm_sregs::default();
        (sregs.cr3, sregs.tr.base) = (CR3, tss);
        // RSP0 at byte 4 of the TSS: the frame ends at it, aligned down,
        // and here spans the kernel's two pages, apart in RAM.
        memory
            .write_obj(KERNEL + 0x1018, GuestAddress(0x10_0104))
            .unwrap();
        assert_eq!(
            entry_frame(&memory, &sregs),
            [(0x10_0fe8, 24), (0x20_0000, 16)]
        );
        memory
            .write_obj(KERNEL + 0x1000, GuestAddress(0x10_0104))
            .unwrap();
        assert_eq!(entry_frame(&memory, &sregs), [(0x10_0fd8, 40)]);
        // Unmapped: nothing is left out.
        memory
            .write_obj(0x1_0000u64, GuestAddress(0x10_0104))
            .unwrap();
        assert_eq!(entry_frame(&memory, &sregs), []);
    }

    #[test]
    fn only_a_state_seen_before_at_a_place_seen_before_is_a_loop() {
        let at = |rip| Place { rip, registers: 7 };
        let mut repeats = Repeats::default();
        assert!(!repeats.place_seen_before(at(0x10)));
        assert!(!repeats.place_seen_before(at(0x20)));
        assert!(repeats.place_seen_before(at(0x10)));
        // The first digest at a place is a first sight of that state.
        assert!(!repeats.state_seen_before(at(0x10), 1));
        // Memory moved on: another state, not a loop.
        assert!(!repeats.state_seen_before(at(0x10), 2));
        assert!(repeats.state_seen_before(at(0x10), 2));
        repeats.exited();
        assert!(!repeats.place_seen_before(at(0x10)));
        assert!(!repeats.state_seen_before(at(0x10), 2));
    }
}
