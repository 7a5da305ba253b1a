//! Property tests of the trace reader against damaged traces: a small but
//! complete trace (every section kind, several event chunks) is damaged at
//! random, and reading it must fail with an error, never panic, never
//! allocate beyond `common::ALLOCATION_LIMIT` and never pass (`CASES` per
//! property). `below_checksums.rs` damages what the checksums cover.

mod common;

use std::path::Path;

use proptest::prelude::*;
use provm_trace::format::{SectionHeader, SectionKind};
use provm_trace::reader::{Trace, Unreadable};

use common::{read_everything, sample_sections, write_trace, EVENTS_PER_CHUNK, EVENT_CHUNKS};

/// A complete trace of several event chunks, as bytes.
fn sample_trace(dir: &Path) -> Vec<u8> {
    write_trace(&dir.join("sample.provm"), &sample_sections())
}

const CASES: u32 = 1000;

/// Opens the trace, decodes its snapshot and reads its whole event log;
/// first peeks at it as `provm inspect` does a trace it cannot read.
fn read(dir: &Path, bytes: &[u8]) -> Result<u64, String> {
    let path = dir.join("damaged.provm");
    std::fs::write(&path, bytes).unwrap();
    let _ = Unreadable::peek(&path);
    read_everything(&path)
}

#[test]
fn the_sample_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = sample_trace(dir.path());
    assert_eq!(
        read(dir.path(), &bytes),
        Ok(u64::from(EVENT_CHUNKS * EVENTS_PER_CHUNK))
    );
}

#[test]
fn a_trace_cut_after_its_outcome_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.provm");
    let mut sections = sample_sections();
    assert_eq!(sections.pop().unwrap().0, SectionKind::Image);
    write_trace(&path, &sections);
    let error = read_everything(&path).unwrap_err();
    assert!(error.contains("cut short"), "{error}");

    // A trace of an older provm promises nothing after its outcome.
    let outcome = sections
        .iter_mut()
        .find(|(kind, _)| *kind == SectionKind::Outcome);
    let outcome = &mut outcome.unwrap().1;
    let mut older: serde_json::Value = serde_json::from_slice(outcome).unwrap();
    older.as_object_mut().unwrap().remove("sections_after");
    *outcome = serde_json::to_vec(&older).unwrap();
    write_trace(&path, &sections);
    assert!(read_everything(&path).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

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

/// A kernel its manifest does not name is refused, unless the caller knows
/// the section (`Trace::open_knowing`, as a replay knows the one it cached
/// itself); a known section whose bytes were damaged is still refused by
/// its checksum.
#[test]
fn a_known_kernel_is_not_decompressed_but_its_checksum_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other-kernel.provm");
    let mut sections = sample_sections();
    let other_kernel = common::compress(b"another kernel");
    let kernel = sections
        .iter_mut()
        .find(|(kind, _)| *kind == SectionKind::Kernel)
        .unwrap();
    kernel.1 = other_kernel.clone();
    let bytes = write_trace(&path, &sections);

    let refused = Trace::open(&path).err().unwrap().to_string();
    assert!(refused.contains("manifest's digest"), "{refused}");
    let kernel_known = |header: &SectionHeader, _: &str| header.kind == SectionKind::Kernel;
    assert!(Trace::open_knowing(&path, kernel_known).is_ok());

    let at = bytes
        .windows(other_kernel.len())
        .position(|window| window == other_kernel.as_slice())
        .unwrap();
    let mut damaged = bytes.clone();
    damaged[at + other_kernel.len() - 1] ^= 1;
    std::fs::write(&path, damaged).unwrap();
    assert!(Trace::open_knowing(&path, kernel_known).is_err());
}
