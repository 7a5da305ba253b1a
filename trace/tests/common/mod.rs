//! A small but complete sample trace, and the helpers the property tests
//! of the reader share: taking a trace apart into its sections, putting it
//! back together with fresh checksums, and reading all of it.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;

use provm_trace::event_log::encode_chunk;
use provm_trace::events::{Encoder, Event, Place};
use provm_trace::format::{SectionKind, SectionWriter, TraceReader};
use provm_trace::hex;
use provm_trace::manifest::{
    CpuModel, HostDescription, ImageFile, ImageIdentity, Manifest, Outcome,
};
use provm_trace::reader::Trace;
use provm_trace::snapshot;
use sha2::{Digest, Sha256};

/// The sample guest's RAM.
pub const MEMORY_MIB: u64 = 1;
pub const EVENT_CHUNKS: u32 = 3;
pub const EVENTS_PER_CHUNK: u32 = 20;
pub const KERNEL_PROFILE: &[u8] = b"{\"task_struct_pid\": 696}";

/// The property tests' allocation bound: every test binary that includes
/// this module refuses (aborts on) a single allocation above the limit.
/// More than any one thing the sample holds or a reader may buffer (an
/// event chunk decompresses to at most 64 MiB).
pub const ALLOCATION_LIMIT: usize = 128 << 20;

struct Bounded;

// SAFETY: forwards to the system allocator, refusing only sizes above the
// limit (a null pointer, which Rust reports and aborts on).
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_LIMIT {
            return std::ptr::null_mut();
        }
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_LIMIT {
            return std::ptr::null_mut();
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

pub type Sections = Vec<(SectionKind, Vec<u8>)>;

pub fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub fn compress(bytes: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(bytes, 1).unwrap()
}

/// The encoded events of each chunk of the sample's log.
pub fn sample_chunks() -> Vec<Vec<u8>> {
    let mut encoder = Encoder::default();
    (0..EVENT_CHUNKS)
        .map(|chunk| {
            let mut events = Vec::new();
            for i in 0..EVENTS_PER_CHUNK {
                let event = match i % 4 {
                    0 => Event::PioWrite {
                        port: 0x20,
                        data: vec![0x20],
                        at: Place {
                            rip: 0xffff_ffff_8100_0000 + u64::from(i),
                            registers: u64::from(chunk),
                        },
                    },
                    1 => Event::Clock(u64::from(chunk * 100 + i)),
                    2 => Event::AgentOutput(vec![i as u8; 3]),
                    _ => Event::ReadResult(vec![i as u8]),
                };
                encoder.encode(&event, &mut events);
            }
            events
        })
        .collect()
}

/// A snapshot of a guest of `MEMORY_MIB`, with two runs of memory.
pub fn sample_snapshot() -> Vec<u8> {
    let state = serde_json::json!({"clock_ns": 1000, "vcpu": {"rip": 4096}});
    snapshot::encode(&state, &[(0, vec![1; 4096]), (65536, vec![2; 8192])])
}

/// A complete trace: every section kind, several event chunks.
pub fn sample_sections() -> Sections {
    let (kernel, initramfs, snapshot) = (
        b"vmlinux".repeat(100),
        b"cpio".repeat(50),
        sample_snapshot(),
    );
    let manifest = Manifest {
        provm_version: "test".into(),
        provm_commit: None,
        machine_version: 1,
        started_unix: 0,
        argv: vec!["true".into()],
        env: Vec::new(),
        cwd: "/".into(),
        user: None,
        root_device: "/dev/vda".into(),
        image: ImageIdentity {
            path: "image.qcow2".into(),
            chain: vec![ImageFile {
                path: "/images/image.qcow2".into(),
                depth: 0,
                role: "image".into(),
                size: 0,
                sha256: sha(b""),
            }],
            container: None,
        },
        kernel_sha256: sha(&kernel),
        kernel_profile_sha256: sha(KERNEL_PROFILE),
        initramfs_sha256: sha(&initramfs),
        snapshot_sha256: sha(&snapshot),
        kernel_cmdline: String::new(),
        memory_mib: MEMORY_MIB,
        cpus: 1,
        chaos_seed: None,
        cpu: CpuModel {
            cpuid: Vec::new(),
            ignored_by_kernel: Vec::new(),
            baseline: None,
            user_space_cpuid: None,
        },
        host: HostDescription {
            kernel: String::new(),
            cpu: String::new(),
            hypervisor: String::new(),
        },
        exitless_limit_seconds: None,
        interrupt_delivery: Default::default(),
        holes: None,
        fork: None,
        inputs: Vec::new(),
        input_disk: None,
        stdin: None,
        stdin_live: false,
        terminal: None,
        outputs: Vec::new(),
    };
    let outcome = Outcome {
        complete: true,
        events: u64::from(EVENT_CHUNKS * EVENTS_PER_CHUNK),
        event_chunks: EVENT_CHUNKS,
        sections_after: Some(vec!["provenance".into(), "image".into()]),
        ..Outcome::default()
    };
    let mut sections = vec![
        (
            SectionKind::Manifest,
            serde_json::to_vec(&manifest).unwrap(),
        ),
        (SectionKind::Kernel, compress(&kernel)),
        (SectionKind::KernelProfile, KERNEL_PROFILE.to_vec()),
        (SectionKind::Initramfs, compress(&initramfs)),
        (SectionKind::Snapshot, snapshot),
    ];
    for (index, events) in sample_chunks().iter().enumerate() {
        let payload = encode_chunk(index as u32, events).unwrap();
        sections.push((SectionKind::Events, payload));
    }
    sections.push((SectionKind::Outcome, serde_json::to_vec(&outcome).unwrap()));
    sections.push((SectionKind::Provenance, b"{}".to_vec()));
    sections.push((SectionKind::Image, compress(b"a disk image")));
    sections
}

/// Writes `sections` as a trace at `path`, each with its checksum computed
/// afresh, and returns its bytes.
pub fn write_trace(path: &Path, sections: &[(SectionKind, Vec<u8>)]) -> Vec<u8> {
    let mut trace = SectionWriter::create(path).unwrap();
    for (kind, payload) in sections {
        trace.section(*kind, payload).unwrap();
    }
    trace.finish().unwrap();
    std::fs::read(path).unwrap()
}

/// The sections of the trace at `path`.
pub fn read_sections(path: &Path) -> Sections {
    let mut reader = TraceReader::open(path).unwrap();
    let mut sections = Vec::new();
    while let Some(section) = reader.next_section().unwrap() {
        sections.push((section.kind, section.payload));
    }
    sections
}

/// What a replay reads of a trace: the verified trace, its snapshot decoded
/// for the manifest's memory size, its embedded image and its whole event
/// log. Returns the
/// number of events, or the error in words.
pub fn read_everything(path: &Path) -> Result<u64, String> {
    let trace = Trace::open(path).map_err(|e| e.to_string())?;
    let decoded = snapshot::decode::<serde_json::Value>(&trace.snapshot, trace.manifest.memory_mib)
        .map_err(|e| e.to_string())?;
    let limit = trace.manifest.memory_mib << 20;
    for (address, bytes) in &decoded.runs {
        assert!(
            address + bytes.len() as u64 <= limit,
            "a run outside RAM was accepted"
        );
    }
    if trace.has_image {
        trace
            .extract_image(&mut std::io::sink())
            .map_err(|e| e.to_string())?;
    }
    let mut events = trace.events().map_err(|e| e.to_string())?;
    let mut count = 0;
    while events.next_event().map_err(|e| e.to_string())?.is_some() {
        count += 1;
    }
    Ok(count)
}
