//! Property tests of the trace reader against damaged traces: a small but
//! complete trace (every section kind, several event chunks) is damaged at
//! random, and reading it must fail with an error, never panic and never
//! pass. Run with PROPTEST_CASES=N for more cases than the default.

use std::path::Path;

use proptest::prelude::*;
use provm_recorder::events::{Encoder, Event};
use provm_recorder::format::{SectionKind, TraceWriter};
use provm_recorder::hex;
use provm_recorder::manifest::{
    CpuModel, HostDescription, ImageFile, ImageIdentity, Manifest, Outcome,
};
use provm_recorder::trace::Trace;
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A complete trace of three event chunks, as bytes.
fn sample_trace(dir: &Path) -> Vec<u8> {
    let (kernel, initramfs, snapshot) =
        (b"vmlinux".repeat(100), b"cpio".repeat(50), vec![3u8; 300]);
    let manifest = Manifest {
        provm_version: "test".into(),
        started_unix: 0,
        argv: vec!["true".into()],
        env: Vec::new(),
        cwd: "/".into(),
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
        },
        kernel_sha256: sha(&kernel),
        initramfs_sha256: sha(&initramfs),
        snapshot_sha256: sha(&snapshot),
        kernel_cmdline: String::new(),
        memory_mib: 128,
        cpu: CpuModel {
            features: Vec::new(),
            ignored_by_kernel: Vec::new(),
        },
        host: HostDescription {
            kernel: String::new(),
            cpu: String::new(),
            hypervisor: String::new(),
        },
        exitless_limit_seconds: None,
    };
    let path = dir.join("sample.provm");
    let mut trace = TraceWriter::create(&path).unwrap();
    let compress = |bytes: &[u8]| zstd::bulk::compress(bytes, 1).unwrap();
    trace
        .section(
            SectionKind::Manifest,
            &serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
    trace
        .section(SectionKind::Kernel, &compress(&kernel))
        .unwrap();
    trace
        .section(SectionKind::Initramfs, &compress(&initramfs))
        .unwrap();
    trace.section(SectionKind::Snapshot, &snapshot).unwrap();
    let mut encoder = Encoder::default();
    for chunk in 0u32..3 {
        let mut events = Vec::new();
        for i in 0..20 {
            let event = match i % 3 {
                0 => Event::PioWrite {
                    port: 0x20,
                    data: vec![0x20],
                },
                1 => Event::Clock(u64::from(chunk * 100 + i)),
                _ => Event::ReadResult(vec![i as u8]),
            };
            encoder.encode(&event, &mut events);
        }
        let mut payload = chunk.to_le_bytes().to_vec();
        payload.extend(compress(&events));
        trace.section(SectionKind::Events, &payload).unwrap();
    }
    let outcome = Outcome {
        complete: true,
        events: 60,
        event_chunks: 3,
        ..Outcome::default()
    };
    trace
        .section(SectionKind::Outcome, &serde_json::to_vec(&outcome).unwrap())
        .unwrap();
    trace.finish().unwrap();
    std::fs::read(path).unwrap()
}

/// Opens the trace and reads its whole event log.
fn read(dir: &Path, bytes: &[u8]) -> Result<usize, String> {
    let path = dir.join("damaged.provm");
    std::fs::write(&path, bytes).unwrap();
    let trace = Trace::open(&path).map_err(|e| e.to_string())?;
    let mut events = trace.events().map_err(|e| e.to_string())?;
    let mut count = 0;
    while events.next_event().map_err(|e| e.to_string())?.is_some() {
        count += 1;
    }
    Ok(count)
}

#[test]
fn the_sample_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = sample_trace(dir.path());
    assert_eq!(read(dir.path(), &bytes), Ok(60));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Any one flipped byte is caught: by the header checks, or by the
    /// checksum over the section holding it.
    #[test]
    fn every_flipped_byte_is_detected(at in any::<prop::sample::Index>(), bits in 1u8..=255) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = sample_trace(dir.path());
        let at = at.index(bytes.len());
        bytes[at] ^= bits;
        prop_assert!(read(dir.path(), &bytes).is_err(), "flip at {} went unnoticed", at);
    }

    /// Any truncation is caught.
    #[test]
    fn every_truncation_is_detected(len in any::<prop::sample::Index>()) {
        let dir = tempfile::tempdir().unwrap();
        let bytes = sample_trace(dir.path());
        let len = len.index(bytes.len());
        prop_assert!(read(dir.path(), &bytes[..len]).is_err());
    }

    /// Several mutations at once (overwrites, insertions, deletions) end in
    /// an error, never a panic.
    #[test]
    fn mixed_damage_never_panics(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = sample_trace(dir.path());
        let original = bytes.clone();
        for (at, value, op) in edits {
            let at = at.index(bytes.len());
            match op {
                0 => bytes[at] = value,
                1 => bytes.insert(at, value),
                _ => { bytes.remove(at); }
            }
        }
        if bytes != original {
            prop_assert!(read(dir.path(), &bytes).is_err());
        }
    }
}
