//! Digests of the machine's state, for state checks: a replay that matched
//! every logged output can still have diverged inside the guest (an input
//! the log missed, such as user-mode RDTSC on PVM, written to a tmpfs file).
//! The recorder digests guest memory at some exits and the whole machine
//! at the guest's power-off (see `Seam::memory_check_due`,
//! `Seam::final_check_due`); the replay digests the same at the same points
//! and compares.
//!
//! xxh3-64: digesting runs at memory bandwidth (SHA-256 would be ten times
//! slower), and a check only needs to notice a difference, not resist a
//! forger: the trace's sections carry SHA-256 for that.

use kvm_bindings::{
    kvm_debugregs, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave,
};
use provm_cpu_model::CpuidEntry;
use serde::Serialize;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::memory::GuestMemory;
use crate::msr::IA32_TSC;
use crate::vcpu::VcpuState;

/// The machine's state as digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDigest {
    /// All guest RAM.
    pub memory: MemoryDigest,
    /// The vCPU's state, less what differs legitimately (`registers`).
    pub registers: u64,
    /// Each device's saved state, by name.
    pub devices: Vec<(&'static str, u64)>,
}

/// Bytes of RAM one piece digest covers: a page (4 KiB) is digested in 16
/// pieces, so that a check that differs names the page and the bytes
/// (`provm_trace::page_digests`, which stores them, has the same sizes).
pub const PIECE_SIZE: usize = 256;

/// All guest RAM as a check digests it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryDigest {
    /// Of every byte: no page is left out, whatever it holds.
    pub whole: u64,
    /// Of each `PIECE_SIZE` bytes from address 0 (16 bits each): where it
    /// differs.
    pub pieces: Vec<u16>,
}

/// The digests of all guest RAM, in one pass: the pieces' digests are
/// taken while each piece is in the cache for the whole digest.
pub fn memory(memory: &GuestMemory) -> MemoryDigest {
    let mut hash = Xxh3::new();
    let mut pieces = Vec::new();
    for region in memory.iter() {
        let len = usize::try_from(region.len()).expect("a mapped region fits the address space");
        // SAFETY: the region stays mapped for its whole length while
        // `memory` lives, and nothing writes it meanwhile: the one vCPU is
        // run by the thread digesting it, and is out of the guest.
        let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr(), len) };
        pieces.reserve(len / PIECE_SIZE);
        for page in bytes.chunks(4096) {
            hash.update(page);
            // Truncated: a piece's digest only says where, not whether.
            pieces.extend(page.chunks(PIECE_SIZE).map(|piece| xxh3_64(piece) as u16));
        }
    }
    MemoryDigest {
        whole: hash.digest(),
        pieces,
    }
}

/// The vCPU's state as a register check compares it.
#[derive(Serialize)]
struct ComparedRegisters<'a> {
    cpuid: &'a [CpuidEntry],
    regs: &'a kvm_regs,
    sregs: &'a kvm_sregs,
    xsave: &'a kvm_xsave,
    events: &'a kvm_vcpu_events,
    debug: &'a kvm_debugregs,
    msrs: Vec<&'a kvm_msr_entry>,
    xcrs: &'a kvm_xcrs,
    mp_state: &'a kvm_mp_state,
}

/// MSRs KVM keeps counting in host time, whatever the guest does, so that
/// no two runs share their values; the guest cannot read them as they
/// are:
/// - IA32_TSC: the TSC is hidden from provm's kernel, and a user-mode
///   RDTSC that reads it natively (PVM) leaves its mark in registers or
///   memory, which are compared;
/// - Hyper-V's VP runtime and reference time counter (0x40000010,
///   0x40000020), which KVM lists on SVM and VMX hosts: the guest sees no
///   Hyper-V CPUID leaves. Seen to differ between a recording and its
///   replay on the SVM test bed.
const HOST_TIME_MSRS: [u32; 3] = [IA32_TSC, 0x4000_0010, 0x4000_0020];

/// The digest of the vCPU's state: general, special, debug, FPU and XSAVE
/// (vector) registers, XCRs, pending events, MP state and MSRs, less the
/// MSRs that count host time (`HOST_TIME_MSRS`).
pub(crate) fn registers(vcpu: &VcpuState) -> u64 {
    let compared = ComparedRegisters {
        cpuid: &vcpu.cpuid,
        regs: &vcpu.regs,
        sregs: &vcpu.sregs,
        xsave: &vcpu.xsave,
        events: &vcpu.events,
        debug: &vcpu.debug,
        msrs: vcpu
            .msrs
            .iter()
            .filter(|msr| !HOST_TIME_MSRS.contains(&msr.index))
            .collect(),
        xcrs: &vcpu.xcrs,
        mp_state: &vcpu.mp_state,
    };
    tracing::trace!(
        target: "provm_vmm::state_digest",
        "compared registers: {}",
        serde_json::to_string(&compared).expect("a saved state serialises")
    );
    digest(&compared)
}

/// The digest of a saved state, through its serialised form.
pub(crate) fn digest(state: &impl Serialize) -> u64 {
    xxh3_64(&serde_json::to_vec(state).expect("a saved state serialises"))
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    #[test]
    fn a_byte_changed_anywhere_in_ram_changes_the_memory_digest() {
        let ram = crate::memory::create(crate::memory::MIN_MEMORY_MIB).unwrap();
        let before = memory(&ram);
        assert_eq!(memory(&ram), before);
        let last = ram.last_addr().0;
        for address in [0, 4096, last] {
            ram.write_obj(1u8, GuestAddress(address)).unwrap();
            let after = memory(&ram);
            assert_ne!(after.whole, before.whole, "a write at {address:#x}");
            let piece = address as usize / PIECE_SIZE;
            let changed: Vec<usize> = (0..before.pieces.len())
                .filter(|&i| after.pieces[i] != before.pieces[i])
                .collect();
            assert_eq!(changed, [piece], "a write at {address:#x}");
            ram.write_obj(0u8, GuestAddress(address)).unwrap();
            assert_eq!(memory(&ram), before);
        }
    }

    #[test]
    fn pieces_are_the_sizes_the_trace_stores() {
        use provm_trace::page_digests;
        assert_eq!(PIECE_SIZE, page_digests::PIECE_SIZE);
        assert_eq!(4096, page_digests::PAGE_SIZE);
    }
}
