//! The trace container: a file header, then sections, each a kind, a length,
//! a SHA-256 over kind, length and payload, and the payload.
//!
//! ```text
//! "PROVMTRC" | version u16 LE | check [u8; 4] | 2 reserved bytes
//! section*:  kind [u8; 4] | length u64 LE | sha256 [u8; 32] | payload
//! ```
//!
//! The check is the first bytes of a SHA-256 over magic and version (zero
//! before format 15), so a damaged version is not read as another format.
//! Every format keeps this header.
//!
//! Sections are written in order as the run goes (the event log in many
//! chunks), so a trace is streamed to disk with bounded memory and read back
//! the same way, every checksum verified before a payload is used.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

pub const MAGIC: &[u8; 8] = b"PROVMTRC";

/// Whether the file at `path` starts as a trace does (a quick look, not a
/// verification: `TraceReader::open` verifies).
pub fn starts_as_trace(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok_and(|()| &magic == MAGIC)
}
/// The format this provm writes. Version 3: every exit event carries the
/// guest's place (RIP and register digest); the manifest records the
/// guest's whole CPUID table (`cpu.cpuid`) instead of seven feature words,
/// the snapshot codec has its own versioned header, and the event log has
/// RDMSR exits (`Event::MsrRead`). Version 4: the kernel's profile (its
/// structure offsets) follows the kernel. Version 5: the manifest names
/// the machine version and the commit that recorded the trace; a provm of
/// format 4 would replay a trace of another machine blindly, so it must
/// refuse the format. Version 6: state checks, the log's `StateCheck`
/// events and the outcome's `state_check`; a format-5 trace has none, and
/// its replay says its state was not checked. Version 7: the network
/// card's frames (`--net`), the log's `NetReceived` and `NetSent` events;
/// a format-6 trace has none. Version 8: the page digests of every state
/// check (`page_digests`), a section after the outcome, which names the
/// pages that differ; a format-7 trace has none, and its replay says only
/// that memory differs. Version 9: guests of more than one vCPU, the log's
/// `Switch` events and the manifest's `cpus` and `chaos_seed`; a format-8
/// trace is of one vCPU. Version 10: the input disk (`InputDisk`, a
/// section after the outcome) that large `--input`s reach the guest on,
/// and the manifest's `input_disk`; a format-9 trace sent every input on
/// the agent channel. Version 11: the final state check's register digest
/// leaves out KVM's TSC frequency (`registers_leave_out_tsc_rate`), which
/// differs between hosts; a format-10 replay would digest it and report
/// registers differing on a host whose TSC runs at another rate.
/// Version 12: the recorder may preempt the guest between exits, logged as
/// a `Preempted` event, which an older provm cannot replay. Version 13:
/// it may preempt a computation that ends by itself too, logged with how
/// long the guest computed before (`EventKind::PreemptedAfter`); a
/// format-12 trace preempted only loops that never end. Version 14: a
/// preemption in user mode digests the guest's memory without the frame
/// of the kernel's last entry from user mode, which a replay on a host
/// that stops user mode at no breakpoint writes as it finds the place
/// (`EventKind::PreemptedInUserMode`); a format-13 trace digested it.
/// Version 15: the header checks its version (`header`); a damaged
/// version byte of a format-14 trace could read as another format.
///
/// Changing what any section holds, or how: bump it, keep reading the old
/// format, and add a golden sample (tests/data/golden/).
pub const FORMAT_VERSION: u16 = 15;
/// The oldest format this provm reads: it reads and replays every format
/// from this one to `FORMAT_VERSION`.
pub const OLDEST_FORMAT: u16 = 4;
/// The formats before `OLDEST_FORMAT`, each with the last provm that wrote
/// it, which replays it (`git checkout` the commit).
pub const RETIRED_FORMATS: &[(u16, &str)] = &[
    (1, "0.1.0 (commit 32b5fc3)"),
    (2, "0.1.0 (commit 4aaad63)"),
    (3, "0.1.0 (commit 96474bd)"),
];
pub const HEADER_LEN: usize = 16;
/// The first format whose header checks its version.
const CHECKED_HEADER: u16 = 15;

/// The file header of a trace of format `version`.
pub fn header(version: u16) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8..10].copy_from_slice(&version.to_le_bytes());
    if version >= CHECKED_HEADER {
        let check = Sha256::digest(&header[..10]);
        header[10..14].copy_from_slice(&check[..4]);
    }
    header
}
/// No section may claim more than this (the largest is an embedded image).
const MAX_SECTION: u64 = 1 << 40;
/// Payloads are verified and copied in pieces of this size: large, as
/// every read costs more under emulation (the test beds read 1 GiB input
/// disks).
const COPY_BUFFER: usize = 1 << 20;

/// What a section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionKind {
    /// JSON: what was run, where, with which inputs (see `manifest`).
    Manifest,
    /// zstd: the guest kernel (vmlinux).
    Kernel,
    /// JSON: the offsets of the kernel's structures, for introspection.
    KernelProfile,
    /// zstd: the initramfs (the agent).
    Initramfs,
    /// The booted guest the run starts from (see `snapshot`).
    Snapshot,
    /// zstd: one chunk of the event log.
    Events,
    /// JSON: how the run ended, its outputs and totals (see `manifest`).
    Outcome,
    /// zstd: the base disk image, when embedded.
    Image,
    /// JSON: the run's provenance, when captured.
    Provenance,
    /// JSON: where the host's time went, exit by exit, aggregated per guest
    /// process and device (`provm blame`). Not an input: replay ignores it.
    Timing,
    /// The page digests of the state checks (see `page_digests`).
    PageDigests,
    /// zstd: the file system image of the inputs the guest read from its
    /// input disk (see the manifest's `input_disk`).
    InputDisk,
}

impl SectionKind {
    const ALL: [SectionKind; 12] = [
        SectionKind::Manifest,
        SectionKind::Kernel,
        SectionKind::KernelProfile,
        SectionKind::Initramfs,
        SectionKind::Snapshot,
        SectionKind::Events,
        SectionKind::Outcome,
        SectionKind::Image,
        SectionKind::Provenance,
        SectionKind::Timing,
        SectionKind::PageDigests,
        SectionKind::InputDisk,
    ];

    fn tag(self) -> [u8; 4] {
        *match self {
            SectionKind::Manifest => b"MANI",
            SectionKind::Kernel => b"KERN",
            SectionKind::KernelProfile => b"KPRF",
            SectionKind::Initramfs => b"INRD",
            SectionKind::Snapshot => b"SNAP",
            SectionKind::Events => b"EVNT",
            SectionKind::Outcome => b"OUTC",
            SectionKind::Image => b"IMAG",
            SectionKind::Provenance => b"PROV",
            SectionKind::Timing => b"TIME",
            SectionKind::PageDigests => b"PAGE",
            SectionKind::InputDisk => b"INPD",
        }
    }

    fn from_tag(tag: [u8; 4]) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.tag() == tag)
    }

    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Manifest => "manifest",
            SectionKind::Kernel => "kernel",
            SectionKind::KernelProfile => "kernel profile",
            SectionKind::Initramfs => "initramfs",
            SectionKind::Snapshot => "snapshot",
            SectionKind::Events => "events",
            SectionKind::Outcome => "outcome",
            SectionKind::Image => "image",
            SectionKind::Provenance => "provenance",
            SectionKind::Timing => "timing",
            SectionKind::PageDigests => "page digests",
            SectionKind::InputDisk => "input disk",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{0} is not a provm trace (no PROVMTRC header)")]
    NotATrace(PathBuf),
    #[error("{path} is a trace of format version {found}, newer than this provm reads ({OLDEST_FORMAT} to {FORMAT_VERSION}): use a newer provm")]
    NewerFormat { path: PathBuf, found: u16 },
    #[error("{path} is a trace of format version {found}, recorded by provm {release} or an earlier one; this provm reads formats {OLDEST_FORMAT} to {FORMAT_VERSION}: replay it with provm {release}")]
    RetiredFormat {
        path: PathBuf,
        found: u16,
        release: &'static str,
    },
    #[error("{0}: the trace's header is corrupt")]
    CorruptHeader(PathBuf),
    #[error("the trace is truncated: it ends inside section {index} ({what}); it was cut short while being copied or written")]
    Truncated { index: usize, what: String },
    #[error("section {index} has an unknown kind {tag:?}: the trace is corrupt")]
    UnknownSection { index: usize, tag: String },
    #[error("section {index} ({kind}) claims {length} bytes: the trace is corrupt")]
    ImplausibleLength {
        index: usize,
        kind: &'static str,
        length: u64,
    },
    #[error("section {index} ({kind}) fails its checksum: the trace is corrupt or was modified")]
    Checksum { index: usize, kind: &'static str },
    #[error("section {index} ({kind}) cannot be decoded: {reason}")]
    Decode {
        index: usize,
        kind: &'static str,
        reason: String,
    },
    #[error("cannot write out section {index} ({kind}): {source}")]
    Output {
        index: usize,
        kind: &'static str,
        source: io::Error,
    },
    #[error("cannot write the trace: {0}")]
    Write(io::Error),
    #[error("cannot read the trace: {0}")]
    Read(io::Error),
}

/// Writes a trace to a temporary file beside PATH (`.NAME.XXXXXX.partial`,
/// removed if the writer is dropped unfinished) and renames it to PATH when
/// finished, so that PATH is either absent or complete, even with several
/// writers at once.
pub struct SectionWriter {
    out: BufWriter<NamedTempFile>,
    path: PathBuf,
}

impl SectionWriter {
    pub fn create(path: &Path) -> Result<Self, FormatError> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let file = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(dir)
            .map_err(FormatError::Write)?;
        // The unfinished file's name made durable, so that a machine's loss
        // leaves it for `provm recover` (see `sync`).
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(FormatError::Write)?;
        let mut out = BufWriter::new(file);
        out.write_all(&header(FORMAT_VERSION))
            .map_err(FormatError::Write)?;
        Ok(SectionWriter {
            out,
            path: path.to_owned(),
        })
    }

    /// Writes a section, all of it handed to the file system before this
    /// returns: a writer killed later (SIGKILL) leaves every section it
    /// wrote whole in the `.partial` file, for `provm recover`.
    pub fn section(&mut self, kind: SectionKind, payload: &[u8]) -> Result<(), FormatError> {
        let length = (payload.len() as u64).to_le_bytes();
        let digest = section_digest(kind.tag(), length, payload);
        let out = &mut self.out;
        out.write_all(&kind.tag())
            .and_then(|()| out.write_all(&length))
            .and_then(|()| out.write_all(&digest))
            .and_then(|()| out.write_all(payload))
            .and_then(|()| out.flush())
            .map_err(FormatError::Write)
    }

    /// Has the storage keep what was written so far: a machine that loses
    /// power later leaves it in the `.partial` file, as a writer killed
    /// outright does.
    pub fn sync(&mut self) -> Result<(), FormatError> {
        self.out
            .get_ref()
            .as_file()
            .sync_data()
            .map_err(FormatError::Write)
    }

    /// Flushes, syncs and renames the trace into place.
    pub fn finish(self) -> Result<PathBuf, FormatError> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| FormatError::Write(e.into_error()))?;
        file.as_file().sync_all().map_err(FormatError::Write)?;
        file.persist(&self.path)
            .map_err(|e| FormatError::Write(e.error))?;
        Ok(self.path)
    }
}

fn section_digest(tag: [u8; 4], length: [u8; 8], payload: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(tag);
    hash.update(length);
    hash.update(payload);
    hash.finalize().into()
}

/// One verified section, read whole.
pub struct Section {
    pub index: usize,
    pub kind: SectionKind,
    pub payload: Vec<u8>,
}

impl Section {
    /// An error about this section's contents.
    pub fn decode_error(&self, reason: impl ToString) -> FormatError {
        FormatError::Decode {
            index: self.index,
            kind: self.kind.name(),
            reason: reason.to_string(),
        }
    }
}

/// A section whose header has been read and whose payload is next.
#[derive(Clone, Copy, Debug)]
pub struct SectionHeader {
    pub index: usize,
    pub kind: SectionKind,
    pub length: u64,
    length_bytes: [u8; 8],
    digest: [u8; 32],
}

impl SectionHeader {
    /// Whether `other` is the same section: the same kind and length, and
    /// the same checksum (SHA-256 of them and the payload), so the same
    /// payload once both are verified.
    pub fn same_section(&self, other: &SectionHeader) -> bool {
        (self.kind, self.length, self.digest) == (other.kind, other.length, other.digest)
    }
}

/// Reads a trace section by section, verifying each.
///
/// `next_section` reads a payload whole; `next_header` then
/// `copy_payload` streams one (an embedded image can be larger than
/// memory). A payload left unread is verified and skipped by the next call.
pub struct TraceReader<R> {
    input: R,
    format_version: u16,
    next_index: usize,
    unread: Option<SectionHeader>,
}

impl TraceReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        Self::new(open_file(path)?, path)
    }

    /// `open`, for a trace of any format (see `of_any_format`).
    pub fn open_any_format(path: &Path) -> Result<Self, FormatError> {
        Self::of_any_format(open_file(path)?, path)
    }
}

fn open_file(path: &Path) -> Result<BufReader<File>, FormatError> {
    File::open(path)
        .map(BufReader::new)
        .map_err(|source| FormatError::Open {
            path: path.to_owned(),
            source,
        })
}

impl<R: Read> TraceReader<R> {
    /// Checks the header, and that this provm reads the trace's format;
    /// `path` only names the trace in errors.
    pub fn new(input: R, path: &Path) -> Result<Self, FormatError> {
        let reader = Self::of_any_format(input, path)?;
        check_readable(reader.format_version, path)?;
        Ok(reader)
    }

    /// Checks the header only: a trace of a format this provm does not
    /// read is read as if its container were this one's, to show what it
    /// can of it (`provm inspect`).
    pub fn of_any_format(mut input: R, path: &Path) -> Result<Self, FormatError> {
        let mut header = [0u8; HEADER_LEN];
        if read_full(&mut input, &mut header).map_err(FormatError::Read)? < HEADER_LEN
            || &header[..8] != MAGIC
        {
            return Err(FormatError::NotATrace(path.to_owned()));
        }
        let format_version = u16::from_le_bytes([header[8], header[9]]);
        // A newer format keeps this header, so its check is verified too.
        if header[..] != self::header(format_version) {
            return Err(FormatError::CorruptHeader(path.to_owned()));
        }
        Ok(TraceReader {
            input,
            format_version,
            next_index: 0,
            unread: None,
        })
    }

    /// The format version in the trace's header.
    pub fn format_version(&self) -> u16 {
        self.format_version
    }

    /// The next section, verified and in memory; `None` at a clean end of
    /// file.
    pub fn next_section(&mut self) -> Result<Option<Section>, FormatError> {
        match self.next_header()? {
            Some(header) => self.read_payload(header).map(Some),
            None => Ok(None),
        }
    }

    /// The payload of the section whose header was just read, verified and
    /// in memory.
    pub fn read_payload(&mut self, header: SectionHeader) -> Result<Section, FormatError> {
        let mut payload = Vec::new();
        self.copy_payload(&mut payload)?;
        Ok(Section {
            index: header.index,
            kind: header.kind,
            payload,
        })
    }

    /// The next section's header; `None` at a clean end of file. The
    /// previous section's payload, if unread, is verified and skipped.
    pub fn next_header(&mut self) -> Result<Option<SectionHeader>, FormatError> {
        if self.unread.is_some() {
            self.copy_payload(&mut io::sink())?;
        }
        let index = self.next_index;
        let mut head = [0u8; 44];
        match read_full(&mut self.input, &mut head).map_err(FormatError::Read)? {
            0 => return Ok(None),
            44 => {}
            _ => {
                return Err(FormatError::Truncated {
                    index,
                    what: "its header".into(),
                })
            }
        }
        let tag: [u8; 4] = head[..4].try_into().unwrap();
        let kind = SectionKind::from_tag(tag).ok_or_else(|| FormatError::UnknownSection {
            index,
            tag: String::from_utf8_lossy(&tag).into_owned(),
        })?;
        let length_bytes: [u8; 8] = head[4..12].try_into().unwrap();
        let length = u64::from_le_bytes(length_bytes);
        if length > MAX_SECTION {
            return Err(FormatError::ImplausibleLength {
                index,
                kind: kind.name(),
                length,
            });
        }
        let header = SectionHeader {
            index,
            kind,
            length,
            length_bytes,
            digest: head[12..44].try_into().unwrap(),
        };
        self.next_index += 1;
        self.unread = Some(header);
        Ok(Some(header))
    }

    /// Copies the payload of the section whose header was just read to
    /// `out` as it is read, and verifies it at its end: on an error, what
    /// reached `out` must be discarded.
    pub fn copy_payload(&mut self, out: &mut impl Write) -> Result<(), FormatError> {
        let header = self
            .unread
            .take()
            .expect("copy_payload follows next_header");
        let mut hash = Sha256::new();
        hash.update(header.kind.tag());
        hash.update(header.length_bytes);
        let mut payload = (&mut self.input).take(header.length);
        let mut buf = vec![0u8; COPY_BUFFER];
        let mut copied = 0u64;
        loop {
            let n = read_full(&mut payload, &mut buf).map_err(FormatError::Read)?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|source| FormatError::Output {
                    index: header.index,
                    kind: header.kind.name(),
                    source,
                })?;
            copied += n as u64;
        }
        if copied != header.length {
            return Err(FormatError::Truncated {
                index: header.index,
                what: header.kind.name().into(),
            });
        }
        if hash.finalize()[..] != header.digest {
            return Err(FormatError::Checksum {
                index: header.index,
                kind: header.kind.name(),
            });
        }
        Ok(())
    }
}

/// Whether this provm reads traces of format `version`; if not, which
/// provm does.
pub fn check_readable(version: u16, path: &Path) -> Result<(), FormatError> {
    if (OLDEST_FORMAT..=FORMAT_VERSION).contains(&version) {
        return Ok(());
    }
    let path = path.to_owned();
    match RETIRED_FORMATS
        .iter()
        .find(|(retired, _)| *retired == version)
    {
        Some(&(_, release)) => Err(FormatError::RetiredFormat {
            path,
            found: version,
            release,
        }),
        // A version before the first is a damaged header, not a format.
        None if version < OLDEST_FORMAT => Err(FormatError::CorruptHeader(path)),
        None => Err(FormatError::NewerFormat {
            path,
            found: version,
        }),
    }
}

/// Reads until `buf` is full or the input ends; returns how much was read.
pub fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(sections: &[(SectionKind, &[u8])]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.provm");
        let mut writer = SectionWriter::create(&path).unwrap();
        for (kind, payload) in sections {
            writer.section(*kind, payload).unwrap();
        }
        assert!(!path.exists(), "only a .partial file exists until finish");
        writer.finish().unwrap();
        std::fs::read(path).unwrap()
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<(SectionKind, Vec<u8>)>, FormatError> {
        let mut reader = TraceReader::new(bytes, Path::new("t.provm"))?;
        let mut out = Vec::new();
        while let Some(section) = reader.next_section()? {
            out.push((section.kind, section.payload));
        }
        Ok(out)
    }

    #[test]
    fn sections_round_trip() {
        let bytes = written(&[(SectionKind::Manifest, b"{}"), (SectionKind::Events, b"")]);
        let sections = read_all(&bytes).unwrap();
        assert_eq!(
            sections,
            [
                (SectionKind::Manifest, b"{}".to_vec()),
                (SectionKind::Events, Vec::new())
            ]
        );
    }

    #[test]
    fn a_streamed_payload_is_verified_at_its_end() {
        let bytes = written(&[(SectionKind::Image, b"image bytes")]);
        let mut reader = TraceReader::new(&bytes[..], Path::new("t.provm")).unwrap();
        reader.next_header().unwrap().unwrap();
        let mut out = Vec::new();
        reader.copy_payload(&mut out).unwrap();
        assert_eq!(out, b"image bytes");

        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut reader = TraceReader::new(&flipped[..], Path::new("t.provm")).unwrap();
        reader.next_header().unwrap().unwrap();
        assert!(matches!(
            reader.copy_payload(&mut Vec::new()),
            Err(FormatError::Checksum { index: 0, .. })
        ));
    }

    #[test]
    fn a_payload_left_unread_is_verified_when_skipped() {
        let bytes = written(&[
            (SectionKind::Image, b"image"),
            (SectionKind::Outcome, b"{}"),
        ]);
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN + 44] ^= 1;
        let mut reader = TraceReader::new(&flipped[..], Path::new("t.provm")).unwrap();
        assert_eq!(
            reader.next_header().unwrap().unwrap().kind,
            SectionKind::Image
        );
        assert!(matches!(
            reader.next_header(),
            Err(FormatError::Checksum { index: 0, .. })
        ));
        let mut reader = TraceReader::new(&bytes[..], Path::new("t.provm")).unwrap();
        reader.next_header().unwrap();
        let outcome = reader.next_section().unwrap().unwrap();
        assert_eq!((outcome.index, &outcome.payload[..]), (1, &b"{}"[..]));
        assert!(reader.next_header().unwrap().is_none());
    }

    #[test]
    fn every_format_from_the_oldest_on_is_read() {
        let bytes = written(&[(SectionKind::Manifest, b"{}")]);
        for version in OLDEST_FORMAT..=FORMAT_VERSION {
            let mut old = bytes.clone();
            old[..HEADER_LEN].copy_from_slice(&header(version));
            let reader = TraceReader::new(&old[..], Path::new("t.provm")).unwrap();
            assert_eq!(reader.format_version(), version);
        }
        for (version, _) in RETIRED_FORMATS {
            assert!(*version < OLDEST_FORMAT);
        }
    }

    #[test]
    fn every_damaged_header_is_refused() {
        let bytes = written(&[(SectionKind::Manifest, b"{}")]);
        for at in 0..HEADER_LEN {
            for bits in 1..=u8::MAX {
                let mut flipped = bytes.clone();
                flipped[at] ^= bits;
                assert!(
                    TraceReader::new(&flipped[..], Path::new("t.provm")).is_err(),
                    "{bits:#x} at {at}"
                );
            }
        }
    }

    #[test]
    fn damage_is_named() {
        let bytes = written(&[(SectionKind::Manifest, b"{\"a\": 1}")]);
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(
            read_all(&flipped),
            Err(FormatError::Checksum { index: 0, .. })
        ));
        assert!(matches!(
            read_all(&bytes[..bytes.len() - 1]),
            Err(FormatError::Truncated { index: 0, .. })
        ));
        let mut future = bytes.clone();
        future[..HEADER_LEN].copy_from_slice(&header(FORMAT_VERSION + 1));
        let newer = read_all(&future).unwrap_err();
        assert!(
            matches!(newer, FormatError::NewerFormat { found, .. } if found == FORMAT_VERSION + 1)
        );
        assert!(newer.to_string().ends_with("use a newer provm"), "{newer}");
        let mut older = bytes.clone();
        older[..HEADER_LEN].copy_from_slice(&header(3));
        let retired = read_all(&older).unwrap_err();
        assert!(
            retired.to_string().contains(&format!(
                "recorded by provm 0.1.0 (commit 96474bd) or an earlier one; this provm reads formats {OLDEST_FORMAT} to {FORMAT_VERSION}: replay it with provm 0.1.0 (commit 96474bd)"
            )),
            "{retired}"
        );
        assert!(matches!(read_all(b"hello"), Err(FormatError::NotATrace(_))));
    }
}
