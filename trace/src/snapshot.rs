//! A snapshot's bytes, as the trace and the snapshot cache store them:
//!
//! ```text
//! "PROVMSNP" | version u16 LE | state length u32 LE | state (JSON) | zstd(run*)
//! run: guest physical address u64 LE | length u64 LE | bytes
//! ```
//!
//! The state is whatever the VMM serialises (this crate does not know its
//! fields); the runs are the guest RAM's non-zero pages, in ascending order,
//! compressed together.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

pub const SNAPSHOT_MAGIC: &[u8; 8] = b"PROVMSNP";
/// The layout above. The state's own layout is the VMM's, versioned
/// separately (its machine version, which the manifest names); bump this
/// when the layout above changes.
pub const SNAPSHOT_VERSION: u16 = 1;
const HEADER_LEN: usize = SNAPSHOT_MAGIC.len() + 2;

/// zstd's level for snapshots: fast; memory pages compress well anyway.
const LEVEL: i32 = 3;
/// The largest guest RAM a snapshot may describe. A manifest's memory size
/// bounds what decoding allocates; this bounds the manifest.
pub const MAX_MEMORY_MIB: u64 = 64 << 10;
/// A run's bytes are read in pieces of at most this, so that a corrupt
/// length cannot allocate more than the data there is.
const RUN_PIECE: u64 = 1 << 20;

/// A VM's state and the contents of its RAM.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot<S> {
    pub state: S,
    /// Runs of non-zero memory: guest physical address and contents,
    /// in ascending order, not overlapping.
    pub runs: Vec<(u64, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("a guest of {0} MiB is larger than provm supports ({MAX_MEMORY_MIB} MiB)")]
    MemoryTooLarge(u64),
    #[error("{0} bytes are too short for a snapshot")]
    TooShort(usize),
    #[error("not a provm snapshot of format version {SNAPSHOT_VERSION} or later (no PROVMSNP header): a snapshot cached by an older provm is rebuilt by booting again; a trace holding one needs the provm that recorded it")]
    NotASnapshot,
    #[error("the snapshot has format version {0}; this provm reads version {SNAPSHOT_VERSION}: use the provm that wrote it, or boot again to rebuild it")]
    Version(u16),
    #[error("the VM state claims {claimed} bytes, {available} remain")]
    StateTruncated { claimed: usize, available: usize },
    #[error("the VM state is not readable: {0}")]
    State(serde_json::Error),
    #[error("the VM state is not machine version {machine}'s as this provm saves it ({source}): it was saved by another build of provm; replay the trace with the provm that recorded it")]
    MachineState {
        machine: u32,
        source: serde_json::Error,
    },
    #[error("the memory image is not readable: {0}")]
    Memory(io::Error),
    #[error("the memory image is truncated: {0}")]
    MemoryTruncated(io::Error),
    #[error(
        "a memory run at {address:#x} of {len} bytes lies outside the guest's {limit} bytes of RAM"
    )]
    RunOutside { address: u64, len: u64, limit: u64 },
    #[error("the memory run at {address:#x} overlaps or precedes the one before it")]
    RunOutOfOrder { address: u64 },
}

/// Encodes `state` (as JSON) and the memory `runs`.
pub fn encode<S: Serialize>(state: &S, runs: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let state = serde_json::to_vec(state).expect("the VM state serialises");
    let mut out = Vec::with_capacity(HEADER_LEN + 4 + state.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    out.extend_from_slice(&(state.len() as u32).to_le_bytes());
    out.extend_from_slice(&state);
    let mut memory = zstd::Encoder::new(out, LEVEL).expect("zstd accepts its own level");
    for (address, bytes) in runs {
        memory
            .write_all(&address.to_le_bytes())
            .and_then(|()| memory.write_all(&(bytes.len() as u64).to_le_bytes()))
            .and_then(|()| memory.write_all(bytes))
            .expect("writing to memory cannot fail");
    }
    memory.finish().expect("writing to memory cannot fail")
}

/// Decodes what `encode` wrote, for a guest of `memory_mib` MiB: every run
/// must lie in its RAM, so a corrupt snapshot allocates no more than the
/// guest's RAM size, and no more than the data it holds.
pub fn decode<S: DeserializeOwned>(
    bytes: &[u8],
    memory_mib: u64,
) -> Result<Snapshot<S>, SnapshotError> {
    let limit = memory_bytes(memory_mib)?;
    let (state, memory) = state_and_memory(bytes)?;
    let state = serde_json::from_slice(state).map_err(SnapshotError::State)?;
    let mut memory = zstd::Decoder::new(memory).map_err(SnapshotError::Memory)?;
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    // Where the previous run ended: runs ascend and do not overlap, so
    // together they hold at most `limit` bytes.
    let mut end_of_last = 0;
    while let Some((address, len)) = run_header(&mut memory)? {
        let end = address.checked_add(len).filter(|&end| end <= limit).ok_or(
            SnapshotError::RunOutside {
                address,
                len,
                limit,
            },
        )?;
        if address < end_of_last {
            return Err(SnapshotError::RunOutOfOrder { address });
        }
        end_of_last = end;
        let mut run = Vec::with_capacity(len.min(RUN_PIECE) as usize);
        let read = (&mut memory)
            .take(len)
            .read_to_end(&mut run)
            .map_err(SnapshotError::Memory)?;
        if read as u64 != len {
            return Err(SnapshotError::MemoryTruncated(
                io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        runs.push((address, run));
    }
    Ok(Snapshot { state, runs })
}

/// The state alone, its memory left unread: what an analysis needs of the
/// snapshot (which vCPU runs first, say) costs no decompression.
pub fn decode_state<S: DeserializeOwned>(bytes: &[u8]) -> Result<S, SnapshotError> {
    let (state, _) = state_and_memory(bytes)?;
    serde_json::from_slice(state).map_err(SnapshotError::State)
}

/// The state's JSON and the compressed memory.
fn state_and_memory(bytes: &[u8]) -> Result<(&[u8], &[u8]), SnapshotError> {
    let bytes = versioned_body(bytes)?;
    let (length, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or(SnapshotError::TooShort(bytes.len()))?;
    let length = u32::from_le_bytes(*length) as usize;
    rest.split_at_checked(length)
        .ok_or(SnapshotError::StateTruncated {
            claimed: length,
            available: rest.len(),
        })
}

/// What follows the magic and version, once both are checked.
fn versioned_body(bytes: &[u8]) -> Result<&[u8], SnapshotError> {
    let (magic, rest) = bytes
        .split_first_chunk::<8>()
        .ok_or(SnapshotError::TooShort(bytes.len()))?;
    if magic != SNAPSHOT_MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let (version, body) = rest
        .split_first_chunk::<2>()
        .ok_or(SnapshotError::TooShort(bytes.len()))?;
    match u16::from_le_bytes(*version) {
        SNAPSHOT_VERSION => Ok(body),
        other => Err(SnapshotError::Version(other)),
    }
}

/// The guest's RAM size in bytes, refused above `MAX_MEMORY_MIB`.
pub fn memory_bytes(memory_mib: u64) -> Result<u64, SnapshotError> {
    if memory_mib > MAX_MEMORY_MIB {
        return Err(SnapshotError::MemoryTooLarge(memory_mib));
    }
    Ok(memory_mib << 20)
}

/// The next run's address and length; `None` at the end of the image.
fn run_header(memory: &mut impl Read) -> Result<Option<(u64, u64)>, SnapshotError> {
    let mut head = [0u8; 16];
    match memory.read(&mut head[..1]) {
        Ok(0) => return Ok(None),
        Ok(_) => memory
            .read_exact(&mut head[1..])
            .map_err(SnapshotError::MemoryTruncated)?,
        Err(e) => return Err(SnapshotError::Memory(e)),
    }
    let address = u64::from_le_bytes(head[..8].try_into().unwrap());
    let len = u64::from_le_bytes(head[8..].try_into().unwrap());
    Ok(Some((address, len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Value = serde_json::Value;

    #[test]
    fn round_trips() {
        let state = serde_json::json!({"clock_ns": 5});
        let runs = vec![(0, vec![1; 4096]), (8192, vec![2; 8192])];
        let decoded: Snapshot<Value> = decode(&encode(&state, &runs), 1).unwrap();
        assert_eq!(decoded, Snapshot { state, runs });
    }

    #[test]
    fn the_state_alone_is_read_without_the_memory() {
        let state = serde_json::json!({"clock_ns": 5});
        let mut bytes = encode(&state, &[(0, vec![1; 4096])]);
        // Memory that would not decompress is never looked at.
        let memory_starts = bytes.len() - 8;
        bytes.truncate(memory_starts);
        assert_eq!(decode_state::<serde_json::Value>(&bytes).unwrap(), state);
        assert!(decode::<serde_json::Value>(&bytes, 1).is_err());
    }

    #[test]
    fn runs_outside_ram_overlapping_or_out_of_order_are_refused() {
        let state = serde_json::json!(null);
        let outside = encode(&state, &[(1 << 20, vec![1])]);
        assert!(matches!(
            decode::<Value>(&outside, 1),
            Err(SnapshotError::RunOutside {
                address: 0x10_0000,
                len: 1,
                ..
            })
        ));
        let overlapping = encode(&state, &[(0, vec![1; 8]), (4, vec![1; 8])]);
        assert!(matches!(
            decode::<Value>(&overlapping, 1),
            Err(SnapshotError::RunOutOfOrder { address: 4 })
        ));
    }

    #[test]
    fn a_huge_memory_size_is_refused_not_overflowed() {
        let bytes = encode(&serde_json::json!(null), &[]);
        assert!(matches!(
            decode::<Value>(&bytes, u64::MAX),
            Err(SnapshotError::MemoryTooLarge(u64::MAX))
        ));
        assert!(decode::<Value>(&bytes, MAX_MEMORY_MIB).is_ok());
    }

    #[test]
    fn a_run_longer_than_its_data_allocates_only_the_data() {
        // A run that claims the whole of a 64 GiB guest and holds 3 bytes.
        let mut raw = Vec::new();
        raw.extend_from_slice(&0u64.to_le_bytes());
        raw.extend_from_slice(&(MAX_MEMORY_MIB << 20).to_le_bytes());
        raw.extend_from_slice(b"abc");
        let mut bytes = SNAPSHOT_MAGIC.to_vec();
        bytes.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&4u32.to_le_bytes());
        bytes.extend_from_slice(b"null");
        bytes.extend(zstd::bulk::compress(&raw, 1).unwrap());
        assert!(matches!(
            decode::<Value>(&bytes, MAX_MEMORY_MIB),
            Err(SnapshotError::MemoryTruncated(_))
        ));
    }

    #[test]
    fn another_version_or_no_header_is_refused_clearly() {
        let mut bytes = encode(&serde_json::json!(null), &[]);
        bytes[8] = 7;
        assert!(matches!(
            decode::<Value>(&bytes, 1),
            Err(SnapshotError::Version(7))
        ));
        // A snapshot of the old, unversioned layout: state length first.
        let mut old = 4u32.to_le_bytes().to_vec();
        old.extend_from_slice(b"null");
        assert!(matches!(
            decode::<Value>(&old, 1),
            Err(SnapshotError::NotASnapshot)
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        // A snapshot is checksummed before it is decoded; this is the second
        // line: arbitrary bytes give an error, never a panic or a huge
        // allocation.
        // Half the cases get past the header, to the state and the memory.
        #[test]
        fn arbitrary_bytes_never_panic(
            headed in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let mut input = Vec::new();
            if headed {
                input.extend_from_slice(SNAPSHOT_MAGIC);
                input.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
            }
            input.extend_from_slice(&bytes);
            let _ = decode::<Value>(&input, 1);
        }
    }
}
