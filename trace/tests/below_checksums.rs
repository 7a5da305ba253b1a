//! Property tests of the trace reader below its checksums: a sample trace
//! is taken apart, one section's contents are changed (the manifest's JSON
//! or fields, the snapshot's state and memory runs, an event chunk), and it
//! is put back together with fresh checksums, as a buggy or malicious writer
//! would. Reading it must give a clear error or valid data: never a panic,
//! an integer overflow (the tests run with overflow checks) or an
//! allocation beyond `common::ALLOCATION_LIMIT` (the test binaries'
//! allocator refuses one, which aborts them). `CASES` cases run per
//! property.

mod common;

use proptest::prelude::*;
use provm_trace::event_log::{chunk_frame, encode_chunk};
use provm_trace::format::{Section, SectionKind};
use provm_trace::manifest::Manifest;

use common::{read_everything, sample_chunks, sample_sections, sha, write_trace, Sections};

const CASES: u32 = 2000;
/// Byte edits: overwrite, insert or remove one byte at a position.
fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
    prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6)
}

fn apply(bytes: &mut Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) {
    for (at, value, op) in edits {
        if bytes.is_empty() {
            bytes.push(*value);
            continue;
        }
        let at = at.index(bytes.len());
        match op {
            0 => bytes[at] = *value,
            1 => bytes.insert(at, *value),
            _ => {
                bytes.remove(at);
            }
        }
    }
}

/// The payload of the first section of `kind`.
fn payload(sections: &mut Sections, kind: SectionKind) -> &mut Vec<u8> {
    &mut sections.iter_mut().find(|(k, _)| *k == kind).unwrap().1
}

/// Makes the manifest name the snapshot's new digest (and its memory size,
/// if given), so that the reader goes on to decode the snapshot.
fn fit_manifest(sections: &mut Sections, memory_mib: Option<u64>) {
    let digest = sha(payload(sections, SectionKind::Snapshot));
    let manifest = payload(sections, SectionKind::Manifest);
    let mut parsed: Manifest = serde_json::from_slice(manifest).unwrap();
    parsed.snapshot_sha256 = digest;
    parsed.memory_mib = memory_mib.unwrap_or(parsed.memory_mib);
    *manifest = serde_json::to_vec(&parsed).unwrap();
}

/// Writes `sections` (checksums afresh) and reads everything back. The
/// result must be an error naming the problem, or data.
fn read_rewritten(sections: &Sections) -> Result<u64, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewritten.provm");
    write_trace(&path, sections);
    let result = read_everything(&path);
    if let Err(error) = &result {
        assert!(!error.trim().is_empty(), "an error without words");
    }
    result
}

/// A raw snapshot: a state length that may lie, the state's bytes, and runs
/// whose claimed lengths may lie too.
fn raw_snapshot(state_len: u32, state: &[u8], runs: &[(u64, u64, Vec<u8>)]) -> Vec<u8> {
    let mut memory = Vec::new();
    for (address, claimed, bytes) in runs {
        memory.extend_from_slice(&address.to_le_bytes());
        memory.extend_from_slice(&claimed.to_le_bytes());
        memory.extend_from_slice(bytes);
    }
    let mut out = state_len.to_le_bytes().to_vec();
    out.extend_from_slice(state);
    out.extend(zstd::bulk::compress(&memory, 1).unwrap());
    out
}

fn address() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..(2 << 20), any::<u64>()]
}

fn run() -> impl Strategy<Value = (u64, u64, Vec<u8>)> {
    // The claimed length: the truth, a lie within a large guest's RAM, or
    // any number.
    let claimed = prop_oneof![
        Just(None),
        (0u64..(1 << 36)).prop_map(Some),
        any::<u64>().prop_map(Some)
    ];
    (
        address(),
        claimed,
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(address, claimed, bytes)| {
            let claimed = claimed.unwrap_or(bytes.len() as u64);
            (address, claimed, bytes)
        })
}

fn memory_mib() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(common::MEMORY_MIB),
        2 => 0u64..=provm_trace::snapshot::MAX_MEMORY_MIB,
        1 => any::<u64>(),
    ]
}

#[test]
fn the_rewritten_sample_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sample.provm");
    write_trace(&path, &sample_sections());
    let sections = common::read_sections(&path);
    assert_eq!(read_rewritten(&sections), Ok(60));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// The manifest's JSON, edited.
    #[test]
    fn edited_manifest_json(edits in edits()) {
        let mut sections = sample_sections();
        apply(payload(&mut sections, SectionKind::Manifest), &edits);
        let _ = read_rewritten(&sections);
    }

    /// The manifest's memory size, any number: the snapshot is decoded
    /// against it.
    #[test]
    fn any_memory_size(memory_mib in memory_mib()) {
        let mut sections = sample_sections();
        fit_manifest(&mut sections, Some(memory_mib));
        let result = read_rewritten(&sections);
        if memory_mib > provm_trace::snapshot::MAX_MEMORY_MIB {
            prop_assert!(result.unwrap_err().contains("larger than provm supports"));
        }
    }

    /// The snapshot's state length and state JSON, edited; its memory runs
    /// at any address, claiming any length.
    #[test]
    fn crafted_snapshot(
        state_len in prop_oneof![3 => Just(None), 1 => any::<u32>().prop_map(Some)],
        state_edits in prop_oneof![3 => Just(Vec::new()), 1 => edits()],
        runs in prop::collection::vec(run(), 0..4),
        memory_mib in memory_mib(),
    ) {
        let mut sections = sample_sections();
        let mut state = br#"{"clock_ns": 1000, "vcpu": {"rip": 4096}}"#.to_vec();
        apply(&mut state, &state_edits);
        let state_len = state_len.unwrap_or(state.len() as u32);
        *payload(&mut sections, SectionKind::Snapshot) = raw_snapshot(state_len, &state, &runs);
        fit_manifest(&mut sections, Some(memory_mib));
        let _ = read_rewritten(&sections);
    }

    /// The snapshot's bytes, edited anywhere (the zstd frame included).
    #[test]
    fn edited_snapshot(edits in edits()) {
        let mut sections = sample_sections();
        apply(payload(&mut sections, SectionKind::Snapshot), &edits);
        fit_manifest(&mut sections, None);
        let _ = read_rewritten(&sections);
    }

    /// One event chunk's events, edited and compressed again; or its
    /// compressed frame edited; or its index changed.
    #[test]
    fn edited_event_chunk(
        chunk in 0..common::EVENT_CHUNKS,
        edits in edits(),
        target in 0u8..3,
        index in any::<u32>(),
    ) {
        let mut sections = sample_sections();
        let chunk_section = sections
            .iter_mut()
            .filter(|(kind, _)| *kind == SectionKind::Events)
            .nth(chunk as usize)
            .unwrap();
        let section = Section { index: 0, kind: SectionKind::Events, payload: chunk_section.1.clone() };
        let frame = chunk_frame(&section, chunk).unwrap();
        chunk_section.1 = match target {
            0 => {
                let mut events = sample_chunks()[chunk as usize].clone();
                apply(&mut events, &edits);
                encode_chunk(chunk, &events).unwrap()
            }
            1 => {
                let mut frame = frame.to_vec();
                apply(&mut frame, &edits);
                let mut payload = chunk.to_le_bytes().to_vec();
                payload.extend(frame);
                payload
            }
            _ => {
                let mut payload = index.to_le_bytes().to_vec();
                payload.extend_from_slice(frame);
                payload
            }
        };
        let result = read_rewritten(&sections);
        if target == 2 && index != chunk {
            prop_assert!(result.unwrap_err().contains("out of sequence"));
        }
    }
}
