//! The event log as a trace stores it: chunks of encoded events, each an
//! `Events` section holding the chunk's index (u32 LE) and a zstd frame,
//! written as the run goes and read back a chunk at a time, so that neither
//! side holds more than a chunk whatever the run's length.

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::events::{Decoder, Encoder, Event, EventKind};
use crate::format::{FormatError, Section, SectionKind, SectionWriter, TraceReader};
use crate::hex;

/// Encoded events are compressed and written once this many bytes gather,
/// or once this long has passed since the last chunk, whichever comes
/// first; each chunk is synced, so that a recording whose machine loses
/// power leaves its log up to a second before (see `EventLogWriter::flush`).
const CHUNK_BYTES: usize = 256 * 1024;
const CHUNK_INTERVAL: Duration = Duration::from_secs(1);
const ZSTD_LEVEL: i32 = 3;
/// No chunk decompresses to more than this (the writer makes ~256 KiB).
const MAX_CHUNK: usize = 64 << 20;

/// What the log holds when the recording ends.
#[derive(Debug)]
pub struct LogTotals {
    pub events: u64,
    pub exits: u64,
    pub chunks: u32,
    pub disk_writes: u64,
    /// SHA-256 over every disk write in order: offset, length, bytes.
    pub disk_writes_sha256: String,
    /// The guest's last clock reading: how far its virtual time got.
    pub last_clock_ns: u64,
    /// SHA-256 over the encoded events, in order: two runs with equal
    /// digests received the same inputs and did the same things. State
    /// checks are left out: they are observations taken where the recorder
    /// chose (a pinned run without a trace takes none, a fork's live part
    /// counts afresh), and what they observe the other events determine.
    pub events_sha256: String,
}

/// SHA-256 over every disk write in order: offset, length, bytes. The
/// recording's is in its outcome; a replay computes its own to compare.
#[derive(Clone, Default)]
pub struct DiskWritesDigest {
    hash: Sha256,
}

impl DiskWritesDigest {
    pub fn add(&mut self, offset: u64, data: &[u8]) {
        self.hash.update(offset.to_le_bytes());
        self.hash.update((data.len() as u64).to_le_bytes());
        self.hash.update(data);
    }

    /// The digest of the writes so far, in hex.
    pub fn hex(&self) -> String {
        hex(&self.hash.clone().finalize())
    }
}

/// Appends events to a trace in chunks, or only digests them (a pinned run
/// without a trace).
pub struct EventLogWriter {
    /// `None`: the events are digested, and stored nowhere.
    trace: Option<SectionWriter>,
    encoder: Encoder,
    pending: Vec<u8>,
    events: u64,
    exits: u64,
    chunks: u32,
    disk_writes: u64,
    disk_digest: DiskWritesDigest,
    last_clock_ns: u64,
    events_digest: Sha256,
    /// When the last chunk was written (or the log began).
    last_chunk: Instant,
    chunk_interval: Duration,
}

impl EventLogWriter {
    /// A log appended to `trace`, for a guest whose clock starts at
    /// `start_ns`.
    pub fn new(trace: SectionWriter, start_ns: u64) -> Self {
        Self::to(Some(trace), start_ns)
    }

    /// A log that only digests its events: what `LogTotals` says of a run
    /// that keeps no trace.
    pub fn digest_only(start_ns: u64) -> Self {
        Self::to(None, start_ns)
    }

    fn to(trace: Option<SectionWriter>, start_ns: u64) -> Self {
        EventLogWriter {
            trace,
            encoder: Encoder::default(),
            pending: Vec::with_capacity(CHUNK_BYTES * 2),
            events: 0,
            exits: 0,
            chunks: 0,
            disk_writes: 0,
            disk_digest: DiskWritesDigest::default(),
            last_clock_ns: start_ns,
            events_digest: Sha256::new(),
            last_chunk: Instant::now(),
            chunk_interval: CHUNK_INTERVAL,
        }
    }

    /// Appends `event`; writes a chunk when enough events have gathered.
    /// After an error the event is kept, and writing is retried later.
    pub fn append(&mut self, event: &Event) -> Result<(), FormatError> {
        if let Event::Clock(ns) = event {
            self.last_clock_ns = *ns;
        }
        self.events += 1;
        self.exits += u64::from(event.is_exit());
        let start = self.pending.len();
        self.encoder.encode(event, &mut self.pending);
        if event.kind() != EventKind::StateCheck {
            self.events_digest.update(&self.pending[start..]);
        }
        if self.pending.len() >= CHUNK_BYTES || self.last_chunk.elapsed() >= self.chunk_interval {
            self.flush()?;
        }
        Ok(())
    }

    /// How many events have been appended.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Appends the event of a disk write and adds its bytes to the digest
    /// of all writes.
    pub fn append_disk_write(&mut self, offset: u64, data: &[u8]) -> Result<(), FormatError> {
        self.disk_writes += 1;
        self.disk_digest.add(offset, data);
        self.append(&Event::disk_write(offset, data))
    }

    /// Writes the last chunk and hands the trace (if any) back for the
    /// sections that follow the log.
    pub fn finish(mut self) -> Result<(Option<SectionWriter>, LogTotals), FormatError> {
        self.flush()?;
        let totals = LogTotals {
            events: self.events,
            exits: self.exits,
            chunks: self.chunks,
            disk_writes: self.disk_writes,
            disk_writes_sha256: self.disk_digest.hex(),
            last_clock_ns: self.last_clock_ns,
            events_sha256: hex(&self.events_digest.finalize()),
        };
        Ok((self.trace, totals))
    }

    fn flush(&mut self) -> Result<(), FormatError> {
        let Some(trace) = self.trace.as_mut() else {
            self.pending.clear();
            return Ok(());
        };
        if self.pending.is_empty() {
            return Ok(());
        }
        let payload = encode_chunk(self.chunks, &self.pending).map_err(FormatError::Write)?;
        trace.section(SectionKind::Events, &payload)?;
        // Synced as well as written: what a killed recording's
        // `.partial` holds survives a power loss too, for `provm recover`.
        trace.sync()?;
        self.chunks += 1;
        self.pending.clear();
        self.last_chunk = Instant::now();
        Ok(())
    }
}

/// The payload of chunk `index` holding the encoded events `events`.
pub fn encode_chunk(index: u32, events: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut payload = index.to_le_bytes().to_vec();
    payload.extend(zstd::bulk::compress(events, ZSTD_LEVEL)?);
    Ok(payload)
}

/// Checks that `section` is event chunk `expected`; returns its zstd frame.
pub fn chunk_frame(section: &Section, expected: u32) -> Result<&[u8], FormatError> {
    let (index, frame) = section
        .payload
        .split_first_chunk::<4>()
        .ok_or_else(|| section.decode_error("too short for an event chunk"))?;
    if u32::from_le_bytes(*index) != expected {
        return Err(section.decode_error(format!(
            "event chunk out of sequence (expected chunk {expected}): chunks are missing or reordered"
        )));
    }
    Ok(frame)
}

/// The event log of a trace file, decoded a chunk at a time. Every section
/// is verified as it is read, up to the outcome, which ends the log: what
/// follows it (an input disk of a GiB, say) is not read.
pub struct EventStream {
    reader: TraceReader<BufReader<File>>,
    decoder: Decoder,
    next_chunk: u32,
    buffered: VecDeque<Event>,
    /// The outcome was reached: no more events.
    ended: bool,
}

impl EventStream {
    /// The log of the trace at `path`, from its first event.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        Ok(EventStream {
            reader: TraceReader::open(path)?,
            decoder: Decoder::default(),
            next_chunk: 0,
            buffered: VecDeque::new(),
            ended: false,
        })
    }

    pub fn next_event(&mut self) -> Result<Option<Event>, FormatError> {
        self.fill()?;
        Ok(self.buffered.pop_front())
    }

    pub fn peek(&mut self) -> Result<Option<&Event>, FormatError> {
        self.fill()?;
        Ok(self.buffered.front())
    }

    fn fill(&mut self) -> Result<(), FormatError> {
        while self.buffered.is_empty() && !self.ended {
            let Some(header) = self.reader.next_header()? else {
                return Ok(());
            };
            if header.kind == SectionKind::Outcome {
                self.ended = true;
                return Ok(());
            }
            // Other sections are verified and skipped by the next call.
            if header.kind != SectionKind::Events {
                continue;
            }
            let section = self.reader.read_payload(header)?;
            let frame = chunk_frame(&section, self.next_chunk)?;
            let chunk =
                zstd::bulk::decompress(frame, MAX_CHUNK).map_err(|e| section.decode_error(e))?;
            self.next_chunk += 1;
            let events = self
                .decoder
                .decode_all(&chunk)
                .map_err(|e| section.decode_error(e))?;
            self.buffered.extend(events);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest of `events` as a log that only digests sees them.
    fn digest(events: &[Event]) -> String {
        let mut log = EventLogWriter::digest_only(0);
        for event in events {
            log.append(event).unwrap();
        }
        let (trace, totals) = log.finish().unwrap();
        assert!(trace.is_none());
        totals.events_sha256
    }

    #[test]
    fn a_digest_only_log_digests_what_a_trace_would_hold() {
        let events = [
            Event::Clock(5),
            Event::ReadResult(vec![1, 2]),
            Event::Clock(9),
        ];
        let path = std::env::temp_dir().join(format!("provm-event-log-{}", std::process::id()));
        let mut traced = EventLogWriter::new(SectionWriter::create(&path).unwrap(), 0);
        for event in &events {
            traced.append(event).unwrap();
        }
        let (trace, totals) = traced.finish().unwrap();
        let _ = std::fs::remove_file(trace.unwrap().finish().unwrap());
        assert_eq!(totals.events_sha256, digest(&events));
        assert_eq!(totals.last_clock_ns, 9);
        assert_ne!(digest(&events), digest(&events[..2]));
        assert_ne!(digest(&events), digest(&[Event::Clock(5), Event::Clock(9)]));
        let mut checked = events.to_vec();
        checked.insert(1, Event::StateCheck { memory: 1 });
        assert_eq!(digest(&checked), digest(&events));
    }

    #[test]
    fn a_chunk_is_written_once_its_interval_has_passed_whatever_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timed.provm");
        let mut log = EventLogWriter::new(SectionWriter::create(&path).unwrap(), 0);
        log.append(&Event::Clock(1)).unwrap();
        assert_eq!(log.chunks, 0, "a few bytes wait for more");
        log.chunk_interval = Duration::ZERO;
        log.append(&Event::Clock(2)).unwrap();
        log.append(&Event::Clock(3)).unwrap();
        assert_eq!(log.chunks, 2);
        assert!(log.pending.is_empty());
        let (trace, totals) = log.finish().unwrap();
        trace.unwrap().finish().unwrap();
        assert_eq!((totals.chunks, totals.events), (2, 3));
    }
}
