//! The recorder: the seam at record time. The guest's clock is host time,
//! ticks wait for exits, and every crossing is appended to the event log,
//! which goes to the trace in compressed chunks as the guest runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use provm_vmm::clock::{Clock, HostClock};
use provm_vmm::seam::{Exit, Seam};
use sha2::{Digest, Sha256};

use crate::events::{Encoder, Event};
use crate::format::{FormatError, SectionKind, TraceWriter};
use crate::hex;

/// Encoded events are compressed and written once this many bytes gather:
/// the recorder's memory stays bounded whatever the run's length.
const CHUNK_BYTES: usize = 256 * 1024;
const ZSTD_LEVEL: i32 = 3;

/// What the log holds when the recording ends.
pub struct LogTotals {
    pub events: u64,
    pub exits: u64,
    pub chunks: u32,
    pub disk_writes: u64,
    pub disk_writes_sha256: String,
    /// The guest's last clock reading: how far its virtual time got.
    pub last_clock_ns: u64,
}

pub struct Recorder {
    clock: HostClock,
    log: Mutex<Log>,
    /// Set from outside (Ctrl-C) to end the recording at the next exit.
    interrupted: &'static AtomicBool,
}

struct Log {
    trace: Option<TraceWriter>,
    encoder: Encoder,
    pending: Vec<u8>,
    events: u64,
    exits: u64,
    chunks: u32,
    disk_writes: u64,
    disk_hash: Sha256,
    last_clock_ns: u64,
    /// The first failure to write the trace; it stops the run.
    error: Option<String>,
}

impl Recorder {
    /// A recorder appending to `trace`, whose clock starts at `start_ns` (the
    /// snapshot's virtual time).
    pub fn new(trace: TraceWriter, start_ns: u64, interrupted: &'static AtomicBool) -> Self {
        Recorder {
            clock: HostClock::starting_at(start_ns),
            log: Mutex::new(Log {
                trace: Some(trace),
                encoder: Encoder::default(),
                pending: Vec::with_capacity(CHUNK_BYTES * 2),
                events: 0,
                exits: 0,
                chunks: 0,
                disk_writes: 0,
                disk_hash: Sha256::new(),
                last_clock_ns: start_ns,
                error: None,
            }),
            interrupted,
        }
    }

    fn log(&self, event: Event) {
        let mut log = self.log.lock().unwrap();
        log.append(&event);
    }

    /// Writes the last chunk and hands the trace back for the sections that
    /// follow the log.
    pub fn finish(&self) -> Result<(TraceWriter, LogTotals), FormatError> {
        let mut log = self.log.lock().unwrap();
        log.flush()?;
        let trace = log.trace.take().expect("a recorder finishes once");
        let totals = LogTotals {
            events: log.events,
            exits: log.exits,
            chunks: log.chunks,
            disk_writes: log.disk_writes,
            disk_writes_sha256: hex(&log.disk_hash.clone().finalize()),
            last_clock_ns: log.last_clock_ns,
        };
        Ok((trace, totals))
    }
}

impl Log {
    fn append(&mut self, event: &Event) {
        if let Event::Clock(ns) = event {
            self.last_clock_ns = *ns;
        }
        self.events += 1;
        self.exits += u64::from(event.is_exit());
        self.encoder.encode(event, &mut self.pending);
        if self.pending.len() >= CHUNK_BYTES {
            if let Err(error) = self.flush() {
                self.error.get_or_insert(error.to_string());
            }
        }
    }

    /// Compresses and writes the pending events as one chunk: its index,
    /// then the zstd frame.
    fn flush(&mut self) -> Result<(), FormatError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut payload = self.chunks.to_le_bytes().to_vec();
        payload
            .extend(zstd::bulk::compress(&self.pending, ZSTD_LEVEL).map_err(FormatError::Write)?);
        let trace = self.trace.as_mut().expect("the log is open until finish");
        trace.section(SectionKind::Events, &payload)?;
        self.chunks += 1;
        self.pending.clear();
        Ok(())
    }
}

impl Clock for Recorder {
    fn monotonic_ns(&self) -> u64 {
        let now = self.clock.monotonic_ns();
        self.log(Event::Clock(now));
        now
    }

    fn wall_ns(&self) -> u64 {
        let now = self.clock.wall_ns();
        self.log(Event::Wall(now));
        now
    }
}

impl Seam for Recorder {
    fn preemptive(&self) -> bool {
        false
    }

    fn wait_until(&self, ns: u64, limit: Instant) {
        self.clock.sleep_until(ns, limit);
    }

    fn exit(&self, exit: Exit<'_>) {
        self.log(Event::from_exit(exit));
    }

    fn read_result(&self, data: &[u8]) {
        self.log(Event::ReadResult(data.to_vec()));
    }

    fn injected(&self, vector: u8) {
        self.log(Event::Inject(vector));
    }

    fn agent_input(&self, bytes: &[u8]) {
        self.log(Event::AgentInput(bytes.to_vec()));
    }

    fn agent_output(&self, bytes: &[u8]) {
        self.log(Event::AgentOutput(bytes.to_vec()));
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        let mut log = self.log.lock().unwrap();
        log.disk_writes += 1;
        log.disk_hash.update(offset.to_le_bytes());
        log.disk_hash.update((data.len() as u64).to_le_bytes());
        log.disk_hash.update(data);
        let event = Event::DiskWrite {
            offset,
            len: data.len() as u32,
            digest: write_digest(data),
        };
        log.append(&event);
    }

    fn stop_reason(&self) -> Option<String> {
        if self.interrupted.load(Ordering::Relaxed) {
            return Some("interrupted (Ctrl-C)".into());
        }
        self.log.lock().unwrap().error.clone()
    }
}

/// The 64-bit digest of one disk write that the log keeps.
pub fn write_digest(data: &[u8]) -> u64 {
    let digest = Sha256::digest(data);
    u64::from_le_bytes(digest[..8].try_into().unwrap())
}
