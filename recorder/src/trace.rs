//! Reading a trace: `Trace::open` verifies every section and keeps what
//! replay and inspection need; the event log is streamed chunk by chunk.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::events::{Decoder, Event, EventKind};
use crate::format::{FormatError, Section, SectionKind, TraceReader};
use crate::hex;
use crate::manifest::{Manifest, Outcome};

/// A verified trace, without its event log and embedded files.
pub struct Trace {
    pub path: PathBuf,
    pub manifest: Manifest,
    pub outcome: Outcome,
    pub snapshot: Vec<u8>,
    pub provenance: Option<Vec<u8>>,
    /// Bytes per section kind, as stored (compressed where compressed).
    pub stored_bytes: BTreeMap<SectionKind, u64>,
    pub has_image: bool,
}

fn structure(path: &Path, what: impl std::fmt::Display) -> FormatError {
    FormatError::Decode {
        index: 0,
        kind: "trace",
        reason: format!("{}: {what}", path.display()),
    }
}

impl Trace {
    /// Reads the whole trace, verifying every section's checksum, the order
    /// of the sections, the event chunks' sequence, and the embedded kernel
    /// and initramfs against the manifest's digests.
    pub fn open(path: &Path) -> Result<Trace, FormatError> {
        let mut reader = TraceReader::open(path)?;
        let first = reader
            .next_section()?
            .ok_or_else(|| structure(path, "the trace is empty"))?;
        if first.kind != SectionKind::Manifest {
            return Err(structure(path, "the trace does not start with a manifest"));
        }
        let manifest: Manifest = json(&first)?;
        let mut stored_bytes = BTreeMap::new();
        *stored_bytes.entry(first.kind).or_default() += first.payload.len() as u64;
        let (mut outcome, mut snapshot, mut provenance) = (None, None, None);
        let (mut chunks, mut has_image) = (0u32, false);
        while let Some(section) = reader.next_section()? {
            *stored_bytes.entry(section.kind).or_default() += section.payload.len() as u64;
            if outcome.is_some()
                && section.kind != SectionKind::Provenance
                && section.kind != SectionKind::Image
            {
                return Err(structure(path, "sections follow the outcome"));
            }
            match section.kind {
                SectionKind::Manifest => return Err(structure(path, "a second manifest")),
                SectionKind::Kernel => check_digest(&section, &manifest.kernel_sha256)?,
                SectionKind::Initramfs => check_digest(&section, &manifest.initramfs_sha256)?,
                SectionKind::Snapshot => {
                    if hex(&Sha256::digest(&section.payload)) != manifest.snapshot_sha256 {
                        return Err(section.decode_error("does not match the manifest's digest"));
                    }
                    snapshot = Some(section.payload);
                }
                SectionKind::Events => {
                    if chunk_index(&section)? != chunks {
                        return Err(section.decode_error(format!(
                            "event chunk out of sequence (expected chunk {chunks}): chunks are missing or reordered"
                        )));
                    }
                    chunks += 1;
                }
                SectionKind::Outcome => outcome = Some(json::<Outcome>(&section)?),
                SectionKind::Provenance => provenance = Some(section.payload),
                SectionKind::Image => has_image = true,
            }
        }
        let outcome = outcome.ok_or_else(|| {
            structure(path, "no outcome section: the recording process was killed before it could finish the trace")
        })?;
        if outcome.event_chunks != chunks {
            return Err(structure(
                path,
                format!(
                    "the outcome counts {} event chunks, the trace holds {chunks}",
                    outcome.event_chunks
                ),
            ));
        }
        let snapshot = snapshot.ok_or_else(|| structure(path, "no snapshot section"))?;
        Ok(Trace {
            path: path.to_owned(),
            manifest,
            outcome,
            snapshot,
            provenance,
            stored_bytes,
            has_image,
        })
    }

    /// The event log, from its first event.
    pub fn events(&self) -> Result<EventStream, FormatError> {
        Ok(EventStream {
            reader: TraceReader::open(&self.path)?,
            decoder: Decoder::default(),
            buffered: VecDeque::new(),
        })
    }

    /// Counts the log's events by kind (reads the whole log).
    pub fn count_events(&self) -> Result<BTreeMap<EventKind, u64>, FormatError> {
        let mut counts = BTreeMap::new();
        let mut events = self.events()?;
        while let Some(event) = events.next_event()? {
            *counts.entry(event.kind()).or_default() += 1;
        }
        Ok(counts)
    }

    /// Writes the embedded base image to `out`, decompressed.
    pub fn extract_image(&self, out: &mut impl Write) -> Result<(), FormatError> {
        let mut reader = TraceReader::open(&self.path)?;
        while let Some(section) = reader.next_section()? {
            if section.kind == SectionKind::Image {
                return zstd::stream::copy_decode(&section.payload[..], out)
                    .map_err(|e| section.decode_error(e));
            }
        }
        Err(structure(&self.path, "no embedded image"))
    }
}

fn json<T: serde::de::DeserializeOwned>(section: &Section) -> Result<T, FormatError> {
    serde_json::from_slice(&section.payload).map_err(|e| section.decode_error(e))
}

/// Checks a zstd-compressed embedded file against its manifest digest.
fn check_digest(section: &Section, expected: &str) -> Result<(), FormatError> {
    let mut hash = Sha256::new();
    zstd::stream::copy_decode(&section.payload[..], &mut hash)
        .map_err(|e| section.decode_error(e))?;
    if hex(&hash.finalize()) != expected {
        return Err(section.decode_error("does not match the manifest's digest"));
    }
    Ok(())
}

fn chunk_index(section: &Section) -> Result<u32, FormatError> {
    let index = section
        .payload
        .first_chunk::<4>()
        .ok_or_else(|| section.decode_error("too short for an event chunk"))?;
    Ok(u32::from_le_bytes(*index))
}

/// The event log, decoded a chunk at a time.
pub struct EventStream {
    reader: TraceReader<BufReader<File>>,
    decoder: Decoder,
    buffered: VecDeque<Event>,
}

impl EventStream {
    pub fn next_event(&mut self) -> Result<Option<Event>, FormatError> {
        self.fill()?;
        Ok(self.buffered.pop_front())
    }

    pub fn peek(&mut self) -> Result<Option<&Event>, FormatError> {
        self.fill()?;
        Ok(self.buffered.front())
    }

    fn fill(&mut self) -> Result<(), FormatError> {
        while self.buffered.is_empty() {
            let Some(section) = self.reader.next_section()? else {
                return Ok(());
            };
            if section.kind != SectionKind::Events {
                continue;
            }
            let chunk = zstd::bulk::decompress(&section.payload[4..], MAX_CHUNK)
                .map_err(|e| section.decode_error(e))?;
            let events = self
                .decoder
                .decode_all(&chunk)
                .map_err(|e| section.decode_error(e))?;
            self.buffered.extend(events);
        }
        Ok(())
    }
}

/// No chunk decompresses to more than this (the recorder writes ~256 KiB).
const MAX_CHUNK: usize = 64 << 20;
