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
use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use xxh3_by_blocks::{Xxh3ByBlocks, BLOCK};

use crate::memory::{is_zero, GuestMemory};
use crate::msr::IA32_TSC;
use crate::vcpu::VcpuState;

mod xxh3_by_blocks;

/// The machine's state as digests.
#[derive(Clone, Debug, PartialEq)]
pub struct StateDigest {
    /// All guest RAM.
    pub memory: MemoryDigest,
    /// The vCPU's state, less what differs legitimately (`registers`).
    pub registers: u64,
    /// The compared registers by part, so that a difference is named
    /// (`register_parts`).
    pub register_parts: Vec<(String, u64)>,
    /// The vCPU's state as traces recorded before 2026-12-02 digested it,
    /// with what KVM keeps of past events (`registers_with_stale_events`).
    pub registers_with_stale_events: u64,
    /// The vCPU's state as older traces digested it, with KVM's TSC
    /// frequency, for any frequency (`RegistersAtTscRate`).
    pub registers_at_tsc_rate: RegistersAtTscRate,
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
/// taken while each piece is in the cache for the whole digest. A piece of
/// zeros, most of a small guest's RAM, is not hashed again: its digest is
/// the same everywhere.
pub fn memory(memory: &GuestMemory) -> MemoryDigest {
    let regions: Vec<&[u8]> = memory
        .iter()
        .map(|region| {
            let len =
                usize::try_from(region.len()).expect("a mapped region fits the address space");
            assert_eq!(len % BLOCK, 0, "a region is whole pages");
            // SAFETY: the region stays mapped for its whole length while
            // `memory` lives, and nothing writes it meanwhile: the one vCPU
            // is run by the thread digesting it, and is out of the guest.
            unsafe { std::slice::from_raw_parts(region.as_ptr(), len) }
        })
        .collect();
    let len: usize = regions.iter().map(|bytes| bytes.len()).sum();
    let zero_piece = xxh3_64(&[0; PIECE_SIZE]) as u16;
    let mut hash = Xxh3ByBlocks::new();
    let mut pieces = Vec::with_capacity(len / PIECE_SIZE);
    let mut blocks = regions
        .iter()
        .flat_map(|bytes| bytes.chunks_exact(BLOCK))
        .map(|block| <&[u8; BLOCK]>::try_from(block).expect("a whole block"))
        .peekable();
    let mut last = None;
    while let Some(block) = blocks.next() {
        let zeros = is_zero(block);
        // Truncated: a piece's digest only says where, not whether.
        pieces.extend(
            block
                .chunks(PIECE_SIZE)
                .map(|piece| match zeros || is_zero(piece) {
                    true => zero_piece,
                    false => xxh3_64(piece) as u16,
                }),
        );
        match (blocks.peek(), zeros) {
            (None, _) => last = Some(block),
            (Some(_), true) => hash.zeros(),
            (Some(_), false) => hash.block(block),
        }
    }
    MemoryDigest {
        whole: hash.finish(last.expect("guest RAM is not empty")),
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
    events: kvm_vcpu_events,
    debug: &'a kvm_debugregs,
    msrs: Vec<&'a kvm_msr_entry>,
    xcrs: &'a kvm_xcrs,
    mp_state: &'a kvm_mp_state,
}

/// KVM's TSC frequency as Hyper-V's TSC frequency MSR shows it
/// (`virtual_tsc_khz` times 1000): the rate at which the host's kernel
/// calibrated its TSC, which differs between machines and between two
/// boots of one (2,600,000,000 and 2,600,001,000 Hz on two boots of the
/// SVM test bed's L1 under load).
const HV_TSC_FREQUENCY: u32 = 0x4000_0022;

/// MSRs whose values are the host's, not the guest's, so that two runs of
/// one guest differ in them; the guest cannot read them as they are:
/// - IA32_TSC: the TSC is hidden from provm's kernel, and a user-mode
///   RDTSC that reads it natively (PVM) leaves its mark in registers or
///   memory, which are compared;
/// - Hyper-V's VP runtime and reference time counter (0x40000010,
///   0x40000020), which KVM lists on SVM and VMX hosts: the guest sees no
///   Hyper-V CPUID leaves. Seen to differ between a recording and its
///   replay on the SVM test bed;
/// - Hyper-V's TSC frequency (`HV_TSC_FREQUENCY`), likewise. Traces before
///   it was left out digested it (`RegistersAtTscRate`).
const HOST_MSRS: [u32; 4] = [IA32_TSC, 0x4000_0010, 0x4000_0020, HV_TSC_FREQUENCY];

/// What older traces left out of the register digest.
const HOST_MSRS_BEFORE_TSC_RATE: [u32; 3] = [IA32_TSC, 0x4000_0010, 0x4000_0020];

/// Which of KVM's pending-event fields a digest takes.
#[derive(Clone, Copy)]
enum Events {
    /// Only those that hold an event (`pending_only`).
    Pending,
    /// All, as traces recorded before 2026-12-02 digested them.
    WithStaleFields,
}

/// `events` without what KVM keeps of an event it has delivered: an
/// exception's vector, error code and payload where none is injected or
/// pending, an interrupt's vector where none is injected. The guest cannot
/// see them; KVM overwrites them with its next event. They differ between
/// a recording and its replay where KVM alone handled something: on the
/// SVM test bed a replay ended with the vector and error code of a page
/// fault (14, 3) that its recording lacked, the rest of its state the
/// same (2026-12-01).
fn pending_only(events: &kvm_vcpu_events) -> kvm_vcpu_events {
    let mut events = *events;
    let exception = &mut events.exception;
    if exception.injected == 0 && exception.pending == 0 {
        exception.nr = 0;
        exception.has_error_code = 0;
        exception.error_code = 0;
        events.exception_has_payload = 0;
        events.exception_payload = 0;
    }
    if events.interrupt.injected == 0 {
        events.interrupt.nr = 0;
        events.interrupt.soft = 0;
    }
    events
}

impl<'a> ComparedRegisters<'a> {
    fn of(vcpu: &'a VcpuState, left_out: &[u32], events: Events) -> Self {
        ComparedRegisters {
            cpuid: &vcpu.cpuid,
            regs: &vcpu.regs,
            sregs: &vcpu.sregs,
            xsave: &vcpu.xsave,
            events: match events {
                Events::Pending => pending_only(&vcpu.events),
                Events::WithStaleFields => vcpu.events,
            },
            debug: &vcpu.debug,
            msrs: vcpu
                .msrs
                .iter()
                .filter(|msr| !left_out.contains(&msr.index))
                .collect(),
            xcrs: &vcpu.xcrs,
            mp_state: &vcpu.mp_state,
        }
    }
}

/// The digest of the vCPU's state: general, special, debug, FPU and XSAVE
/// (vector) registers, XCRs, pending events, MP state and MSRs, less the
/// host's MSRs (`HOST_MSRS`) and what KVM keeps of past events
/// (`pending_only`).
pub(crate) fn registers(vcpu: &VcpuState) -> u64 {
    let compared = ComparedRegisters::of(vcpu, &HOST_MSRS, Events::Pending);
    tracing::trace!(
        target: "provm_vmm::state_digest",
        "compared registers: {}",
        serde_json::to_string(&compared).expect("a saved state serialises")
    );
    digest(&compared)
}

/// `registers` as traces recorded before 2026-12-02 digested them, with
/// what KVM keeps of past events.
pub(crate) fn registers_with_stale_events(vcpu: &VcpuState) -> u64 {
    digest(&ComparedRegisters::of(
        vcpu,
        &HOST_MSRS,
        Events::WithStaleFields,
    ))
}

/// The registers `registers` compares, by part: the digest of each group
/// KVM saves and each MSR's value, by a name starting "MSR ".
pub(crate) fn register_parts(vcpu: &VcpuState) -> Vec<(String, u64)> {
    let compared = ComparedRegisters::of(vcpu, &HOST_MSRS, Events::Pending);
    let groups = [
        ("CPUID", digest(&compared.cpuid)),
        ("general", digest(compared.regs)),
        ("special", digest(compared.sregs)),
        ("debug", digest(compared.debug)),
        ("vector (XSAVE)", digest(compared.xsave)),
        ("events", digest(&compared.events)),
        ("XCRs", digest(compared.xcrs)),
        ("MP state", digest(compared.mp_state)),
    ];
    let msrs = compared
        .msrs
        .iter()
        .map(|msr| (format!("MSR {:#x}", msr.index), msr.data));
    groups
        .into_iter()
        .map(|(name, digest)| (name.to_owned(), digest))
        .chain(msrs)
        .collect()
}

/// The register digest in the form traces took before they left KVM's
/// TSC frequency out, with the frequency open: a replay of such a trace on
/// a host whose KVM calibrated its TSC at another rate finds the
/// recording host's rate (`find`), and the check compares the rest. The
/// serialised state around the frequency's value, so that trying a rate
/// digests only what follows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RegistersAtTscRate {
    /// The serialised state before KVM's TSC frequency MSR, that MSR, and
    /// the serialised state after it; `None` (the default) where this KVM
    /// lists no such MSR, whose digest is the same in both forms.
    split: Option<(Vec<u8>, kvm_msr_entry, Vec<u8>)>,
}

/// The rates `RegistersAtTscRate::find` tries, in kHz (KVM's unit):
/// 100 MHz to 10 GHz.
const TSC_KHZ_TRIED: std::ops::RangeInclusive<u64> = 100_000..=10_000_000;

impl RegistersAtTscRate {
    pub(crate) fn of(vcpu: &VcpuState) -> Self {
        let Some(rate) = vcpu.msrs.iter().find(|msr| msr.index == HV_TSC_FREQUENCY) else {
            return RegistersAtTscRate { split: None };
        };
        let older =
            ComparedRegisters::of(vcpu, &HOST_MSRS_BEFORE_TSC_RATE, Events::WithStaleFields);
        let state = serde_json::to_vec(&older).expect("a saved state serialises");
        let entry = serde_json::to_vec(rate).expect("an MSR serialises");
        // The MSR list comes after every other array that could hold the
        // same numbers, and an MSR's index appears once in it.
        let msrs = find(&state, b"\"msrs\":").expect("the state has its MSRs");
        let at = msrs + find(&state[msrs..], &entry).expect("the MSR is in the list");
        RegistersAtTscRate {
            split: Some((
                state[..at].to_vec(),
                *rate,
                state[at + entry.len()..].to_vec(),
            )),
        }
    }

    /// The digest in the older form at this host's TSC frequency; `None`
    /// where its KVM lists none (the digest is then the same in both
    /// forms).
    pub fn own(&self) -> Option<u64> {
        let (before, rate, after) = self.split.as_ref()?;
        Some(Self::finish(Self::started(before), rate, rate.data, after))
    }

    /// The TSC frequency in Hz at which this state's digest in the older
    /// form is `recorded`: the recording host's, if it is a whole number
    /// of kHz between 100 MHz and 10 GHz and the rest of the state is the
    /// same. Tried from this host's own rate outward, nearest first: one
    /// host's boots differ by a kHz or so. `None` where no rate gives it,
    /// or this KVM lists no TSC frequency to try.
    pub fn find(&self, recorded: u64) -> Option<u64> {
        let (before, rate, after) = self.split.as_ref()?;
        let hash = Self::started(before);
        let (lowest, highest) = TSC_KHZ_TRIED.into_inner();
        let own = (rate.data / 1000).clamp(lowest, highest);
        let mut nearest_first = (0..=highest - lowest)
            .flat_map(|step| [own.checked_add(step), own.checked_sub(step + 1)])
            .flatten()
            .filter(|khz| (lowest..=highest).contains(khz));
        nearest_first.find_map(|khz| {
            let hz = khz * 1000;
            (Self::finish(hash.clone(), rate, hz, after) == recorded).then_some(hz)
        })
    }

    /// The hash of the serialised state before the frequency's value.
    fn started(before: &[u8]) -> Xxh3Default {
        let mut hash = Xxh3Default::new();
        hash.update(before);
        hash
    }

    fn finish(mut hash: Xxh3Default, rate: &kvm_msr_entry, hz: u64, after: &[u8]) -> u64 {
        let entry = kvm_msr_entry { data: hz, ..*rate };
        hash.update(&serde_json::to_vec(&entry).expect("an MSR serialises"));
        hash.update(after);
        hash.digest()
    }
}

/// Where `needle` first appears in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
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

    /// What traces store: XXH3-64 of every byte of RAM, and each piece's
    /// XXH3-64 truncated, however many pages are zeros.
    #[test]
    fn the_memory_digest_is_xxh3_of_all_ram_and_of_each_piece() {
        let ram = crate::memory::create(crate::memory::MIN_MEMORY_MIB).unwrap();
        for (address, value) in [(0x10, 7u64), (0x1_2345, u64::MAX), (0x40_0000, 3)] {
            ram.write_obj(value, GuestAddress(address)).unwrap();
        }
        let mut bytes = vec![0; ram.last_addr().0 as usize + 1];
        ram.read_slice(&mut bytes, GuestAddress(0)).unwrap();
        let digest = memory(&ram);
        assert_eq!(digest.whole, xxh3_64(&bytes));
        let pieces: Vec<u16> = bytes
            .chunks(PIECE_SIZE)
            .map(|piece| xxh3_64(piece) as u16)
            .collect();
        assert_eq!(digest.pieces, pieces);
    }

    #[test]
    fn pieces_are_the_sizes_the_trace_stores() {
        use provm_trace::page_digests;
        assert_eq!(PIECE_SIZE, page_digests::PIECE_SIZE);
        assert_eq!(4096, page_digests::PAGE_SIZE);
    }

    /// A vCPU whose KVM reports its TSC at `hz`, between other MSRs.
    fn vcpu_at_tsc_rate(hz: u64) -> VcpuState {
        let msr = |index, data| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        };
        VcpuState {
            cpuid: Vec::new(),
            regs: kvm_regs {
                rip: 0xffff_ffff_8101_4450,
                ..Default::default()
            },
            sregs: Default::default(),
            xsave: Default::default(),
            events: Default::default(),
            debug: Default::default(),
            msrs: vec![
                msr(0x174, 0),
                msr(HV_TSC_FREQUENCY, hz),
                msr(0x4000_0023, 1_000_000_000),
                msr(IA32_TSC, hz / 3),
            ],
            xcrs: Default::default(),
            mp_state: Default::default(),
        }
    }

    /// The register digest as traces before format 11 took it.
    fn older_digest(vcpu: &VcpuState) -> u64 {
        digest(&ComparedRegisters::of(
            vcpu,
            &HOST_MSRS_BEFORE_TSC_RATE,
            Events::WithStaleFields,
        ))
    }

    #[test]
    fn the_hosts_tsc_rate_is_left_out_and_an_older_digest_finds_it() {
        let recording = vcpu_at_tsc_rate(2_600_000_000);
        let replaying = vcpu_at_tsc_rate(2_600_001_000);
        assert_eq!(registers(&recording), registers(&replaying));
        assert_eq!(register_parts(&recording), register_parts(&replaying));
        let older = RegistersAtTscRate::of(&replaying);
        assert_eq!(older.own(), Some(older_digest(&replaying)));
        assert_ne!(older.own(), Some(older_digest(&recording)));
        assert_eq!(older.find(older_digest(&recording)), Some(2_600_000_000));
        // Another machine's rate, far from this one's.
        let elsewhere = vcpu_at_tsc_rate(3_493_442_000);
        assert_eq!(older.find(older_digest(&elsewhere)), Some(3_493_442_000));
    }

    /// Measured on the SVM test bed: a replay's KVM had last injected a
    /// page fault that its recording's had not.
    #[test]
    fn what_kvm_keeps_of_a_delivered_event_is_left_out_but_a_pending_one_counts() {
        let recording = vcpu_at_tsc_rate(2_600_000_000);
        let mut replaying = vcpu_at_tsc_rate(2_600_000_000);
        replaying.events.exception.nr = 14;
        replaying.events.exception.has_error_code = 1;
        replaying.events.exception.error_code = 3;
        replaying.events.interrupt.nr = 48;
        assert_eq!(registers(&recording), registers(&replaying));
        assert_eq!(register_parts(&recording), register_parts(&replaying));
        assert_ne!(
            registers_with_stale_events(&recording),
            registers_with_stale_events(&replaying)
        );
        for pending in [
            |events: &mut kvm_vcpu_events| events.exception.pending = 1,
            |events: &mut kvm_vcpu_events| events.exception.injected = 1,
            |events: &mut kvm_vcpu_events| events.interrupt.injected = 1,
        ] {
            let delivering = |exception, interrupt| {
                let mut vcpu = vcpu_at_tsc_rate(2_600_000_000);
                vcpu.events.exception.nr = exception;
                vcpu.events.interrupt.nr = interrupt;
                pending(&mut vcpu.events);
                vcpu
            };
            assert_ne!(
                registers(&delivering(14, 48)),
                registers(&delivering(6, 32))
            );
        }
    }

    #[test]
    fn no_tsc_rate_matches_an_older_digest_of_other_registers() {
        let mut recording = vcpu_at_tsc_rate(2_600_000_000);
        recording.regs.rflags = 0x10046; // RF set
        let replaying = vcpu_at_tsc_rate(2_600_000_000);
        let differing: Vec<String> = register_parts(&recording)
            .into_iter()
            .zip(register_parts(&replaying))
            .filter(|(recorded, replayed)| recorded != replayed)
            .map(|(recorded, _)| recorded.0)
            .collect();
        assert_eq!(differing, ["general"]);
        let replaying = RegistersAtTscRate::of(&replaying);
        assert_eq!(replaying.find(older_digest(&recording)), None);
        // A KVM that lists no TSC frequency has one form only.
        let mut without = vcpu_at_tsc_rate(0);
        without.msrs.retain(|msr| msr.index != HV_TSC_FREQUENCY);
        let older = RegistersAtTscRate::of(&without);
        assert_eq!(older.own(), None);
        assert_eq!(older_digest(&without), registers(&without));
    }
}
