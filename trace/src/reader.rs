//! Reading a trace: `Trace::open` verifies every section and keeps what
//! replay and inspection need; the event log is streamed chunk by chunk
//! (see `event_log`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::event_log::{chunk_frame, EventStream};
use crate::events::EventKind;
use crate::format::{FormatError, Section, SectionHeader, SectionKind, TraceReader};
use crate::hex;
use crate::manifest::{Manifest, Outcome};

/// A verified trace, without its event log and embedded files.
pub struct Trace {
    pub path: PathBuf,
    /// The format version in its header.
    pub format_version: u16,
    pub manifest: Manifest,
    pub outcome: Outcome,
    pub snapshot: Vec<u8>,
    /// The kernel profile's JSON.
    pub kernel_profile: Vec<u8>,
    pub provenance: Option<Vec<u8>>,
    /// The run's exit timing (JSON), when it was captured.
    pub timing: Option<Vec<u8>>,
    /// The state checks' page digests (`page_digests`), as stored: traces
    /// of format 8 on.
    pub page_digests: Option<Vec<u8>>,
    /// Bytes per section kind, as stored (compressed where compressed).
    pub stored_bytes: BTreeMap<SectionKind, u64>,
    pub has_image: bool,
    pub has_input_disk: bool,
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
    /// of the sections, the event chunks' sequence, and the embedded kernel,
    /// initramfs and snapshot against the manifest's digests. The event log
    /// and an embedded image are verified, not kept.
    pub fn open(path: &Path) -> Result<Trace, FormatError> {
        Self::open_knowing(path, |_, _| false)
    }

    /// As `open`, less the decompression of an embedded kernel or
    /// initramfs that `known` recognises, by its header and its manifest
    /// digest, as a section made from the file of that digest: its
    /// checksum is still verified.
    pub fn open_knowing(
        path: &Path,
        known: impl Fn(&SectionHeader, &str) -> bool,
    ) -> Result<Trace, FormatError> {
        let mut reader = TraceReader::open(path)?;
        let format_version = reader.format_version();
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
        let (mut timing, mut page_digests) = (None, None);
        let mut kernel_profile = None;
        let (mut chunks, mut has_image, mut has_input_disk) = (0u32, false, false);
        let mut after_outcome = Vec::new();
        while let Some(header) = reader.next_header()? {
            *stored_bytes.entry(header.kind).or_default() += header.length;
            if outcome.is_some() {
                if ![
                    SectionKind::Provenance,
                    SectionKind::Image,
                    SectionKind::Timing,
                    SectionKind::PageDigests,
                    SectionKind::InputDisk,
                ]
                .contains(&header.kind)
                {
                    return Err(structure(path, "sections follow the outcome"));
                }
                after_outcome.push(header.kind.name().to_owned());
            }
            match header.kind {
                SectionKind::Manifest => return Err(structure(path, "a second manifest")),
                SectionKind::Kernel if !known(&header, &manifest.kernel_sha256) => {
                    check_digest(&reader.read_payload(header)?, &manifest.kernel_sha256)?
                }
                SectionKind::Initramfs if !known(&header, &manifest.initramfs_sha256) => {
                    check_digest(&reader.read_payload(header)?, &manifest.initramfs_sha256)?
                }
                SectionKind::KernelProfile => {
                    let section = reader.read_payload(header)?;
                    check_plain_digest(&section, &manifest.kernel_profile_sha256)?;
                    kernel_profile = Some(section.payload);
                }
                SectionKind::Snapshot => {
                    let section = reader.read_payload(header)?;
                    check_plain_digest(&section, &manifest.snapshot_sha256)?;
                    snapshot = Some(section.payload);
                }
                SectionKind::Events => {
                    chunk_frame(&reader.read_payload(header)?, chunks)?;
                    chunks += 1;
                }
                SectionKind::Outcome => {
                    outcome = Some(json::<Outcome>(&reader.read_payload(header)?)?)
                }
                SectionKind::Provenance => provenance = Some(reader.read_payload(header)?.payload),
                SectionKind::Timing => timing = Some(reader.read_payload(header)?.payload),
                SectionKind::PageDigests => {
                    page_digests = Some(reader.read_payload(header)?.payload)
                }
                // Known: its checksum is verified as the next header is
                // read, which skips its payload.
                SectionKind::Kernel | SectionKind::Initramfs => {}
                // Verified, not kept: reading the next header skips it.
                SectionKind::Image => has_image = true,
                SectionKind::InputDisk => has_input_disk = true,
            }
        }
        let outcome = outcome.ok_or_else(|| {
            structure(path, "no outcome section: the recording process was killed before it could finish the trace; `provm recover` makes a trace of what it wrote")
        })?;
        if let Some(promised) = outcome.sections_after.as_ref() {
            if *promised != after_outcome {
                return Err(structure(
                    path,
                    format!("the outcome promises the sections {promised:?} after it, the trace holds {after_outcome:?}: it was cut short or altered"),
                ));
            }
        }
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
        let kernel_profile =
            kernel_profile.ok_or_else(|| structure(path, "no kernel profile section"))?;
        Ok(Trace {
            path: path.to_owned(),
            format_version,
            manifest,
            outcome,
            snapshot,
            kernel_profile,
            provenance,
            timing,
            page_digests,
            stored_bytes,
            has_image,
            has_input_disk,
        })
    }

    /// The event log, from its first event.
    pub fn events(&self) -> Result<EventStream, FormatError> {
        EventStream::open(&self.path)
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

    /// Writes the embedded base image to `out`, decompressed, as it is read
    /// (an image can be larger than memory). Its checksum is verified at
    /// its end: on an error, `out` holds garbage.
    pub fn extract_image(&self, out: &mut impl Write) -> Result<(), FormatError> {
        self.extract(SectionKind::Image, out)
    }

    /// Writes the embedded input disk to `out`, as `extract_image` does.
    pub fn extract_input_disk(&self, out: &mut impl Write) -> Result<(), FormatError> {
        self.extract(SectionKind::InputDisk, out)
    }

    /// Writes the embedded kernel (vmlinux, with its symbols) to `out`,
    /// decompressed, as `extract_image` does.
    pub fn extract_kernel(&self, out: &mut impl Write) -> Result<(), FormatError> {
        self.extract(SectionKind::Kernel, out)
    }

    /// The embedded kernel, decompressed.
    pub fn kernel(&self) -> Result<Vec<u8>, FormatError> {
        let mut kernel = Vec::new();
        self.extract_kernel(&mut kernel)?;
        Ok(kernel)
    }

    /// Decompresses the first section of `kind` into `out`.
    fn extract(&self, kind: SectionKind, out: &mut impl Write) -> Result<(), FormatError> {
        let mut reader = TraceReader::open(&self.path)?;
        while let Some(header) = reader.next_header()? {
            if header.kind != kind {
                continue;
            }
            let output_error = |source| FormatError::Output {
                index: header.index,
                kind: header.kind.name(),
                source,
            };
            let mut decoder = zstd::stream::write::Decoder::new(out).map_err(output_error)?;
            reader.copy_payload(&mut decoder)?;
            return decoder.flush().map_err(output_error);
        }
        Err(structure(
            &self.path,
            format!("no embedded {}", kind.name()),
        ))
    }
}

/// What can be read of a trace of a format this provm does not read
/// (`FormatError::NewerFormat`, `RetiredFormat`), for `provm inspect`.
pub struct Unreadable {
    pub format_version: u16,
    /// Its manifest, as JSON: a newer format's may have fields this provm
    /// does not know, and lack ones it does. An error if the trace's
    /// container is not this one's or does not start with a manifest.
    pub manifest: Result<serde_json::Value, FormatError>,
}

impl Unreadable {
    /// Reads the header and, if the container is this one's, the manifest;
    /// every checksum it reads is verified.
    pub fn peek(path: &Path) -> Result<Unreadable, FormatError> {
        let mut reader = TraceReader::open_any_format(path)?;
        let format_version = reader.format_version();
        let manifest = reader.next_section().and_then(|first| match first {
            Some(section) if section.kind == SectionKind::Manifest => json(&section),
            _ => Err(structure(path, "the trace does not start with a manifest")),
        });
        Ok(Unreadable {
            format_version,
            manifest,
        })
    }
}

fn json<T: serde::de::DeserializeOwned>(section: &Section) -> Result<T, FormatError> {
    serde_json::from_slice(&section.payload).map_err(|e| section.decode_error(e))
}

/// Checks a section's payload against its manifest digest.
fn check_plain_digest(section: &Section, expected: &str) -> Result<(), FormatError> {
    if hex(&Sha256::digest(&section.payload)) != expected {
        return Err(section.decode_error("does not match the manifest's digest"));
    }
    Ok(())
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
