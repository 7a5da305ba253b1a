//! The agent channel's wire format, shared by the host (provm) and the guest
//! agent.
//!
//! The channel is a byte stream (the guest's virtio console, /dev/hvc0, in raw
//! mode). Every message is one frame: a kind byte, a little-endian u32 payload
//! length, then the payload. Payload fields are length-prefixed byte strings
//! and little-endian integers, so the agent needs no serialisation library
//! (it is copied into guest memory at every boot, so every kilobyte counts).

// Every unsafe block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod paths;
pub mod records;
pub mod tree;

pub use tree::{Entry, EntryContent};

/// Largest payload either side accepts; a longer frame means a corrupt stream.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Bytes of frame header: kind (1) and payload length (4).
pub const HEADER_LEN: usize = 5;

/// What the host asks the guest to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Job {
    /// Program and arguments; argv[0] is looked up in PATH like a shell does.
    pub argv: Vec<Vec<u8>>,
    /// The whole environment of the command, as `KEY=VALUE` entries.
    pub env: Vec<Vec<u8>>,
    /// Working directory inside the image's root file system.
    pub cwd: Vec<u8>,
    /// Block device holding the image's root file system, e.g. `/dev/vda1`.
    pub root_device: Vec<u8>,
    /// Fresh host entropy for the guest kernel's random pool, mixed in and
    /// reseeded before the command starts: guests restored from one snapshot
    /// must not share their random numbers.
    pub entropy: Vec<u8>,
    /// The wall-clock time to set before the command starts, in nanoseconds
    /// since the Unix epoch: a guest restored from a snapshot would
    /// otherwise tell the time the snapshot was taken.
    pub wall_clock_ns: u64,
    /// Capture the command's provenance: the agent traces its processes and
    /// file accesses and sends [`GuestMessage::Provenance`] before Finished.
    pub provenance: bool,
    /// Where the host's inputs appear, read-only (absolute guest paths;
    /// index = [`Entry::tree`]). Their content follows the job as
    /// [`HostMessage::Entry`] messages.
    pub inputs: Vec<Vec<u8>>,
    /// The command's standard input follows the job as
    /// [`HostMessage::Stdin`] messages; without it, /dev/null.
    pub stdin: bool,
    /// What comes back after the command: each of these guest paths (a
    /// directory made empty beforehand when missing) is sent as
    /// [`GuestMessage::Entry`] messages before Finished.
    pub outputs: Vec<Vec<u8>>,
    /// Who the command runs as: `USER[:GROUP]`, each a name (looked up in
    /// the image's /etc/passwd and /etc/group) or a number, as a container
    /// image's `User` says it; empty: root.
    pub user: Vec<u8>,
}

/// How the command ended, as the agent saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it.
    Signaled(i32),
    /// argv[0] was not found (a shell's 127).
    NotFound,
    /// argv[0] exists but could not be executed (a shell's 126).
    NotExecutable,
}

/// How a job ended, in words.
impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Exited(code) => write!(f, "exit {code}"),
            Outcome::Signaled(signal) => write!(f, "signal {signal}"),
            Outcome::NotFound => f.write_str("not found"),
            Outcome::NotExecutable => f.write_str("not executable"),
        }
    }
}

impl Outcome {
    /// The exit status a shell would give for this outcome.
    pub fn shell_status(self) -> i32 {
        match self {
            Outcome::Exited(code) => code,
            Outcome::Signaled(signal) => 128 + signal,
            Outcome::NotFound => 127,
            Outcome::NotExecutable => 126,
        }
    }
}

/// Messages from the host to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostMessage {
    /// Run this command and report its output and outcome.
    Run(Job),
    /// Sync the disks and power the guest off.
    PowerOff,
    /// Part of an input (see [`Job::inputs`]); the agent answers each data
    /// message with [`GuestMessage::Received`].
    Entry(Entry),
    /// Part of the command's standard input (see [`Job::stdin`]).
    Stdin(Vec<u8>),
    /// Every input and all of standard input has been sent: the command
    /// may start.
    DataEnd,
}

/// Messages from the agent to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestMessage {
    /// The agent is up and waiting for a job.
    Ready,
    /// Bytes the command wrote to its standard output.
    Stdout(Vec<u8>),
    /// Bytes the command wrote to its standard error.
    Stderr(Vec<u8>),
    /// Part of the job's provenance (when the job asked for it), in as many
    /// messages as the records need, all before Finished.
    Provenance(Vec<ProvRecord>),
    /// The command ended; its output has all been sent.
    Finished(Outcome),
    /// The agent could not run the job (the root would not mount, ...).
    Failed(Vec<u8>),
    /// The agent has stored one data message (an input's [`HostMessage::Entry`]
    /// or a [`HostMessage::Stdin`]): the host's flow control, which keeps a
    /// bounded number of them in flight.
    Received,
    /// Part of an output (see [`Job::outputs`]), after the command ended.
    Entry(Entry),
}

/// One fact of a job's provenance as the agent observed it. Ids are
/// numbered by the agent within the job; records refer only to ids defined
/// by earlier records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProvRecord {
    /// An environment (`KEY=VALUE` entries), shared by the processes that
    /// started with it.
    Environment { id: u32, entries: Vec<Vec<u8>> },
    /// One version of a file: its content at a moment of the job.
    File(FileVersion),
    /// A program a process ran, from its fork or exec to its exit or next
    /// exec.
    Process(Process),
    /// `process` was started by `starter`: forked by it, or (`exec`) the same
    /// process going on in a new program.
    Started {
        process: u32,
        starter: u32,
        exec: bool,
    },
    /// `process` read (or, with `execute`, ran) `file`; `seq` orders the
    /// job's file events.
    Used {
        process: u32,
        file: u32,
        execute: bool,
        seq: u64,
    },
    /// `process` wrote `file`.
    Generated { file: u32, process: u32, seq: u64 },
    /// `file` has the content of `from` under another name: `process`
    /// renamed or linked it.
    Derived { file: u32, from: u32, process: u32 },
    /// `process` deleted `file`, or renamed it away.
    Invalidated { file: u32, process: u32, seq: u64 },
}

/// A version of a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileVersion {
    pub id: u32,
    /// Absolute path in the image's root.
    pub path: Vec<u8>,
    /// SHA-256 of the content; empty when the content is not recorded (not
    /// a regular file, or a kernel file system such as /proc).
    pub sha256: Vec<u8>,
    pub size: u64,
}

/// A process running one program.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub id: u32,
    pub pid: u32,
    /// The executable, as the kernel resolved it.
    pub exe: Vec<u8>,
    pub argv: Vec<Vec<u8>>,
    /// Its environment's id.
    pub env: u32,
    /// Guest wall-clock (CLOCK_REALTIME) nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
    /// How it ended; `None` when it went on in another program (exec).
    pub outcome: Option<Outcome>,
}

impl Process {
    /// A process that forked without exec'ing is called `comm` now
    /// (/proc/PID/comm): whether that names another program than the one
    /// it runs, as multi-call binaries do (busybox's shell runs `sort` in
    /// a fork, renamed but not exec'd).
    pub fn renamed_to(&self, comm: &[u8]) -> bool {
        let called = self.argv.first().map_or(&self.exe, |argv0| argv0);
        let base = called.rsplit(|&byte| byte == b'/').next().unwrap_or(called);
        // The kernel keeps 15 bytes of a name.
        !base.starts_with(comm) || comm.len() < base.len().min(15)
    }
}

/// A frame that could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    UnknownKind(u8),
    TooLong(usize),
    Truncated,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownKind(kind) => write!(f, "unknown message kind {kind}"),
            DecodeError::TooLong(len) => write!(f, "payload of {len} bytes exceeds {MAX_PAYLOAD}"),
            DecodeError::Truncated => write!(f, "payload ends inside a field"),
        }
    }
}

impl std::error::Error for DecodeError {}

mod kind {
    pub const RUN: u8 = 1;
    pub const POWER_OFF: u8 = 2;
    pub const ENTRY: u8 = 3;
    pub const STDIN: u8 = 4;
    pub const DATA_END: u8 = 5;
    pub const READY: u8 = 0x81;
    pub const STDOUT: u8 = 0x82;
    pub const STDERR: u8 = 0x83;
    pub const FINISHED: u8 = 0x84;
    pub const FAILED: u8 = 0x85;
    pub const PROVENANCE: u8 = 0x86;
    pub const RECEIVED: u8 = 0x87;
    pub const OUTPUT_ENTRY: u8 = 0x88;
}

mod record_tag {
    pub const ENVIRONMENT: u8 = 0;
    pub const FILE: u8 = 1;
    pub const PROCESS: u8 = 2;
    pub const STARTED: u8 = 3;
    pub const USED: u8 = 4;
    pub const GENERATED: u8 = 5;
    pub const DERIVED: u8 = 6;
    pub const INVALIDATED: u8 = 7;
}

mod outcome_tag {
    pub const EXITED: u8 = 0;
    pub const SIGNALED: u8 = 1;
    pub const NOT_FOUND: u8 = 2;
    pub const NOT_EXECUTABLE: u8 = 3;
}

impl HostMessage {
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        let kind = match self {
            HostMessage::Run(job) => {
                put_list(&mut payload, &job.argv);
                put_list(&mut payload, &job.env);
                put_bytes(&mut payload, &job.cwd);
                put_bytes(&mut payload, &job.root_device);
                put_bytes(&mut payload, &job.entropy);
                put_u64(&mut payload, job.wall_clock_ns);
                payload.push(job.provenance.into());
                put_list(&mut payload, &job.inputs);
                payload.push(job.stdin.into());
                put_list(&mut payload, &job.outputs);
                // Only when set: a job as root encodes as it did before.
                if !job.user.is_empty() {
                    put_bytes(&mut payload, &job.user);
                }
                kind::RUN
            }
            HostMessage::PowerOff => kind::POWER_OFF,
            HostMessage::Entry(entry) => {
                entry.encode(&mut payload);
                kind::ENTRY
            }
            HostMessage::Stdin(bytes) => {
                payload.extend_from_slice(bytes);
                kind::STDIN
            }
            HostMessage::DataEnd => kind::DATA_END,
        };
        frame(kind, &payload)
    }

    /// The message whose frame starts `bytes` (one send of the host's, as a
    /// trace logs it), if it decodes.
    pub fn of_frame(bytes: &[u8]) -> Option<HostMessage> {
        let mut frames = FrameReader::default();
        frames.push(bytes);
        let (kind, payload) = frames.next_frame().ok()??;
        HostMessage::decode(kind, &payload).ok()
    }

    /// Whether this is part of a job's data (see [`Job::inputs`]).
    pub fn is_data(&self) -> bool {
        matches!(
            self,
            HostMessage::Entry(_) | HostMessage::Stdin(_) | HostMessage::DataEnd
        )
    }

    pub fn decode(kind: u8, payload: &[u8]) -> Result<Self, DecodeError> {
        let mut reader = Reader(payload);
        let message = match kind {
            kind::RUN => {
                let mut job = Job {
                    argv: reader.list()?,
                    env: reader.list()?,
                    cwd: reader.bytes()?,
                    root_device: reader.bytes()?,
                    entropy: reader.bytes()?,
                    wall_clock_ns: reader.u64()?,
                    provenance: reader.u8()? != 0,
                    ..Job::default()
                };
                // Jobs logged by provm before inputs, stdin and outputs end
                // here: those traces keep their meaning.
                if !reader.0.is_empty() {
                    job.inputs = reader.list()?;
                    job.stdin = reader.bool()?;
                    job.outputs = reader.list()?;
                }
                // A job run as root ends here too (see `encode`).
                if !reader.0.is_empty() {
                    job.user = reader.bytes()?;
                }
                HostMessage::Run(job)
            }
            kind::POWER_OFF => HostMessage::PowerOff,
            kind::ENTRY => HostMessage::Entry(Entry::decode(&mut reader)?),
            kind::STDIN => return Ok(HostMessage::Stdin(payload.to_vec())),
            kind::DATA_END => HostMessage::DataEnd,
            other => return Err(DecodeError::UnknownKind(other)),
        };
        reader.finish(message)
    }
}

impl GuestMessage {
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        let kind = match self {
            GuestMessage::Ready => kind::READY,
            GuestMessage::Stdout(bytes) => {
                payload.extend_from_slice(bytes);
                kind::STDOUT
            }
            GuestMessage::Stderr(bytes) => {
                payload.extend_from_slice(bytes);
                kind::STDERR
            }
            GuestMessage::Provenance(records) => {
                for record in records {
                    put_record(&mut payload, record);
                }
                kind::PROVENANCE
            }
            GuestMessage::Finished(outcome) => {
                put_outcome(&mut payload, *outcome);
                kind::FINISHED
            }
            GuestMessage::Failed(reason) => {
                payload.extend_from_slice(reason);
                kind::FAILED
            }
            GuestMessage::Received => kind::RECEIVED,
            GuestMessage::Entry(entry) => {
                entry.encode(&mut payload);
                kind::OUTPUT_ENTRY
            }
        };
        frame(kind, &payload)
    }

    pub fn decode(kind: u8, payload: &[u8]) -> Result<Self, DecodeError> {
        let message = match kind {
            kind::READY => GuestMessage::Ready,
            kind::STDOUT => return Ok(GuestMessage::Stdout(payload.to_vec())),
            kind::STDERR => return Ok(GuestMessage::Stderr(payload.to_vec())),
            kind::FAILED => return Ok(GuestMessage::Failed(payload.to_vec())),
            kind::PROVENANCE => {
                let mut reader = Reader(payload);
                let mut records = Vec::new();
                while !reader.0.is_empty() {
                    records.push(reader.record()?);
                }
                return Ok(GuestMessage::Provenance(records));
            }
            kind::FINISHED => {
                let mut reader = Reader(payload);
                let outcome = reader.outcome()?;
                return reader.finish(GuestMessage::Finished(outcome));
            }
            kind::RECEIVED => GuestMessage::Received,
            kind::OUTPUT_ENTRY => {
                let mut reader = Reader(payload);
                let entry = Entry::decode(&mut reader)?;
                return reader.finish(GuestMessage::Entry(entry));
            }
            other => return Err(DecodeError::UnknownKind(other)),
        };
        Reader(payload).finish(message)
    }
}

/// The records as Provenance messages, each within [`MAX_PAYLOAD`] (a
/// record larger than that gets a message of its own, which the host
/// refuses: the agent keeps records far smaller).
pub fn provenance_messages(records: Vec<ProvRecord>) -> Vec<GuestMessage> {
    let mut messages = Vec::new();
    let (mut batch, mut size) = (Vec::new(), 0);
    for record in records {
        let mut encoded = Vec::new();
        put_record(&mut encoded, &record);
        if size + encoded.len() > MAX_PAYLOAD && !batch.is_empty() {
            messages.push(GuestMessage::Provenance(std::mem::take(&mut batch)));
            size = 0;
        }
        size += encoded.len();
        batch.push(record);
    }
    if !batch.is_empty() {
        messages.push(GuestMessage::Provenance(batch));
    }
    messages
}

/// Splits a byte stream into frames; feed it bytes as they arrive.
///
/// A bad frame header ends the stream: with length-prefixed frames nothing
/// after it can be found again. The reader then keeps no more bytes (they
/// would pile up for ever) and gives the same error at every call.
#[derive(Clone, Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
    broken: Option<DecodeError>,
}

impl FrameReader {
    /// Whether a bad frame has ended the stream.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.broken.is_none() {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// The next complete frame as (kind, payload), if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, DecodeError> {
        if let Some(error) = &self.broken {
            return Err(error.clone());
        }
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buffer[1..HEADER_LEN].try_into().unwrap()) as usize;
        if len > MAX_PAYLOAD {
            self.buffer = Vec::new();
            let error = DecodeError::TooLong(len);
            self.broken = Some(error.clone());
            return Err(error);
        }
        if self.buffer.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let kind = self.buffer[0];
        let payload = self.buffer[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buffer.drain(..HEADER_LEN + len);
        Ok(Some((kind, payload)))
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_list(out: &mut Vec<u8>, items: &[Vec<u8>]) {
    put_u32(out, items.len() as u32);
    for item in items {
        put_bytes(out, item);
    }
}

pub(crate) fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_outcome(out: &mut Vec<u8>, outcome: Outcome) {
    let (tag, value) = match outcome {
        Outcome::Exited(code) => (outcome_tag::EXITED, code),
        Outcome::Signaled(signal) => (outcome_tag::SIGNALED, signal),
        Outcome::NotFound => (outcome_tag::NOT_FOUND, 0),
        Outcome::NotExecutable => (outcome_tag::NOT_EXECUTABLE, 0),
    };
    out.push(tag);
    out.extend_from_slice(&value.to_le_bytes());
}

/// Tag 0xff stands for no outcome (a process that went on with exec).
const NO_OUTCOME: u8 = 0xff;

fn put_record(out: &mut Vec<u8>, record: &ProvRecord) {
    match record {
        ProvRecord::Environment { id, entries } => {
            out.push(record_tag::ENVIRONMENT);
            put_u32(out, *id);
            put_list(out, entries);
        }
        ProvRecord::File(file) => {
            out.push(record_tag::FILE);
            put_u32(out, file.id);
            put_bytes(out, &file.path);
            put_bytes(out, &file.sha256);
            put_u64(out, file.size);
        }
        ProvRecord::Process(process) => {
            out.push(record_tag::PROCESS);
            put_u32(out, process.id);
            put_u32(out, process.pid);
            put_bytes(out, &process.exe);
            put_list(out, &process.argv);
            put_u32(out, process.env);
            put_u64(out, process.start_ns);
            put_u64(out, process.end_ns);
            match process.outcome {
                Some(outcome) => put_outcome(out, outcome),
                None => out.push(NO_OUTCOME),
            }
        }
        ProvRecord::Started {
            process,
            starter,
            exec,
        } => {
            out.push(record_tag::STARTED);
            put_u32(out, *process);
            put_u32(out, *starter);
            out.push((*exec).into());
        }
        ProvRecord::Used {
            process,
            file,
            execute,
            seq,
        } => {
            out.push(record_tag::USED);
            put_u32(out, *process);
            put_u32(out, *file);
            out.push((*execute).into());
            put_u64(out, *seq);
        }
        ProvRecord::Generated { file, process, seq } => {
            out.push(record_tag::GENERATED);
            put_u32(out, *file);
            put_u32(out, *process);
            put_u64(out, *seq);
        }
        ProvRecord::Derived {
            file,
            from,
            process,
        } => {
            out.push(record_tag::DERIVED);
            put_u32(out, *file);
            put_u32(out, *from);
            put_u32(out, *process);
        }
        ProvRecord::Invalidated { file, process, seq } => {
            out.push(record_tag::INVALIDATED);
            put_u32(out, *file);
            put_u32(out, *process);
            put_u64(out, *seq);
        }
    }
}

/// Reads a payload's fields in order.
pub(crate) struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    pub(crate) fn take(&mut self, len: usize) -> Result<&[u8], DecodeError> {
        if self.0.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    fn bool(&mut self) -> Result<bool, DecodeError> {
        Ok(self.u8()? != 0)
    }

    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    fn list(&mut self) -> Result<Vec<Vec<u8>>, DecodeError> {
        let count = self.u32()? as usize;
        // Each item needs at least its 4-byte length: bounds the allocation.
        if count > self.0.len() / 4 {
            return Err(DecodeError::Truncated);
        }
        (0..count).map(|_| self.bytes()).collect()
    }

    fn outcome(&mut self) -> Result<Outcome, DecodeError> {
        self.optional_outcome()?
            .ok_or(DecodeError::UnknownKind(NO_OUTCOME))
    }

    /// An outcome, or `None` for [`NO_OUTCOME`].
    fn optional_outcome(&mut self) -> Result<Option<Outcome>, DecodeError> {
        let tag = self.u8()?;
        if tag == NO_OUTCOME {
            return Ok(None);
        }
        let value = self.u32()? as i32;
        Ok(Some(match tag {
            outcome_tag::EXITED => Outcome::Exited(value),
            outcome_tag::SIGNALED => Outcome::Signaled(value),
            outcome_tag::NOT_FOUND => Outcome::NotFound,
            outcome_tag::NOT_EXECUTABLE => Outcome::NotExecutable,
            other => return Err(DecodeError::UnknownKind(other)),
        }))
    }

    fn record(&mut self) -> Result<ProvRecord, DecodeError> {
        Ok(match self.u8()? {
            record_tag::ENVIRONMENT => ProvRecord::Environment {
                id: self.u32()?,
                entries: self.list()?,
            },
            record_tag::FILE => ProvRecord::File(FileVersion {
                id: self.u32()?,
                path: self.bytes()?,
                sha256: self.bytes()?,
                size: self.u64()?,
            }),
            record_tag::PROCESS => ProvRecord::Process(Process {
                id: self.u32()?,
                pid: self.u32()?,
                exe: self.bytes()?,
                argv: self.list()?,
                env: self.u32()?,
                start_ns: self.u64()?,
                end_ns: self.u64()?,
                outcome: self.optional_outcome()?,
            }),
            record_tag::STARTED => ProvRecord::Started {
                process: self.u32()?,
                starter: self.u32()?,
                exec: self.bool()?,
            },
            record_tag::USED => ProvRecord::Used {
                process: self.u32()?,
                file: self.u32()?,
                execute: self.bool()?,
                seq: self.u64()?,
            },
            record_tag::GENERATED => ProvRecord::Generated {
                file: self.u32()?,
                process: self.u32()?,
                seq: self.u64()?,
            },
            record_tag::DERIVED => ProvRecord::Derived {
                file: self.u32()?,
                from: self.u32()?,
                process: self.u32()?,
            },
            record_tag::INVALIDATED => ProvRecord::Invalidated {
                file: self.u32()?,
                process: self.u32()?,
                seq: self.u64()?,
            },
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }

    /// Trailing bytes mean the two sides disagree on the format.
    fn finish<T>(self, value: T) -> Result<T, DecodeError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(DecodeError::Truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip_guest(message: GuestMessage) {
        let mut reader = FrameReader::default();
        let bytes = message.encode();
        // Byte-at-a-time delivery must reassemble the same frame.
        for (i, byte) in bytes.iter().enumerate() {
            reader.push(&[*byte]);
            let frame = reader.next_frame().unwrap();
            assert_eq!(frame.is_some(), i + 1 == bytes.len());
            if let Some((kind, payload)) = frame {
                assert_eq!(GuestMessage::decode(kind, &payload).unwrap(), message);
            }
        }
    }

    #[test]
    fn guest_messages_round_trip() {
        round_trip_guest(GuestMessage::Ready);
        round_trip_guest(GuestMessage::Stdout(b"hi\n".to_vec()));
        round_trip_guest(GuestMessage::Stderr(Vec::new()));
        round_trip_guest(GuestMessage::Finished(Outcome::Exited(3)));
        round_trip_guest(GuestMessage::Finished(Outcome::Signaled(9)));
        round_trip_guest(GuestMessage::Finished(Outcome::NotFound));
        round_trip_guest(GuestMessage::Failed(b"no root".to_vec()));
    }

    fn sample_records() -> Vec<ProvRecord> {
        vec![
            ProvRecord::Environment {
                id: 0,
                entries: vec![b"PATH=/bin".to_vec()],
            },
            ProvRecord::File(FileVersion {
                id: 0,
                path: b"/data/in.txt".to_vec(),
                sha256: vec![7; 32],
                size: 15,
            }),
            ProvRecord::Process(Process {
                id: 0,
                pid: 22,
                exe: b"/bin/busybox".to_vec(),
                argv: vec![b"sort".to_vec(), Vec::new()],
                env: 0,
                start_ns: 1,
                end_ns: 2,
                outcome: None,
            }),
            ProvRecord::Process(Process {
                id: 1,
                outcome: Some(Outcome::Signaled(9)),
                ..Process::default()
            }),
            ProvRecord::Started {
                process: 1,
                starter: 0,
                exec: true,
            },
            ProvRecord::Used {
                process: 0,
                file: 0,
                execute: false,
                seq: 1,
            },
            ProvRecord::Generated {
                file: 0,
                process: 1,
                seq: 2,
            },
            ProvRecord::Derived {
                file: 1,
                from: 0,
                process: 1,
            },
            ProvRecord::Invalidated {
                file: 0,
                process: 1,
                seq: 3,
            },
        ]
    }

    #[test]
    fn provenance_records_round_trip_in_bounded_messages() {
        round_trip_guest(GuestMessage::Provenance(sample_records()));
        let many: Vec<ProvRecord> = (0..40_000)
            .map(|id| {
                ProvRecord::File(FileVersion {
                    id,
                    path: vec![b'x'; 40],
                    ..FileVersion::default()
                })
            })
            .collect();
        let messages = provenance_messages(many.clone());
        assert!(messages.len() > 1);
        let mut received = Vec::new();
        for message in messages {
            let bytes = message.encode();
            assert!(bytes.len() - HEADER_LEN <= MAX_PAYLOAD);
            let GuestMessage::Provenance(records) = message else {
                panic!("not provenance");
            };
            received.extend(records);
        }
        assert_eq!(received, many);
    }

    #[test]
    fn run_job_round_trips() {
        let job = HostMessage::Run(Job {
            argv: vec![b"/bin/sh".to_vec(), b"-c".to_vec(), b"echo hi".to_vec()],
            env: vec![b"PATH=/bin".to_vec()],
            cwd: b"/".to_vec(),
            root_device: b"/dev/vda".to_vec(),
            entropy: vec![7; 32],
            wall_clock_ns: 1_700_000_000_123_456_789,
            provenance: true,
            inputs: vec![b"/data".to_vec()],
            stdin: true,
            outputs: vec![b"/out".to_vec(), b"/tmp/result.csv".to_vec()],
            user: b"app:staff".to_vec(),
        });
        let mut reader = FrameReader::default();
        reader.push(&job.encode());
        let (kind, payload) = reader.next_frame().unwrap().unwrap();
        assert_eq!(HostMessage::decode(kind, &payload).unwrap(), job);
    }

    /// A job as provm logged it before inputs, stdin and outputs: it still
    /// decodes, with none of them.
    #[test]
    fn a_job_without_data_fields_decodes() {
        let job = Job {
            argv: vec![b"true".to_vec()],
            ..Job::default()
        };
        let encoded = HostMessage::Run(job.clone()).encode();
        // Drop the three fields: two empty lists (4 bytes each) and a flag.
        let old = &encoded[HEADER_LEN..encoded.len() - 9];
        assert_eq!(
            HostMessage::decode(kind::RUN, old).unwrap(),
            HostMessage::Run(job)
        );
    }

    #[test]
    fn data_messages_round_trip() {
        for message in [
            HostMessage::Stdin(b"a,b\n1,2\n".to_vec()),
            HostMessage::DataEnd,
            HostMessage::Entry(Entry {
                tree: 1,
                path: b"sub/x.csv".to_vec(),
                content: EntryContent::File { mode: 0o644 },
            }),
        ] {
            let mut reader = FrameReader::default();
            reader.push(&message.encode());
            let (kind, payload) = reader.next_frame().unwrap().unwrap();
            assert_eq!(HostMessage::decode(kind, &payload).unwrap(), message);
        }
        round_trip_guest(GuestMessage::Received);
        round_trip_guest(GuestMessage::Entry(Entry {
            tree: 0,
            path: Vec::new(),
            content: EntryContent::Data(vec![1, 2, 3]),
        }));
    }

    #[test]
    fn corrupt_frames_are_errors() {
        let mut reader = FrameReader::default();
        reader.push(&[kind::STDOUT, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(reader.next_frame(), Err(DecodeError::TooLong(_))));
        assert_eq!(
            HostMessage::decode(kind::RUN, &[9, 0, 0, 0]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            GuestMessage::decode(0x7f, &[]),
            Err(DecodeError::UnknownKind(0x7f))
        );
    }

    /// After a bad header nothing more is kept, and the error stays.
    #[test]
    fn a_broken_stream_keeps_no_more_bytes_and_stays_broken() {
        let mut reader = FrameReader::default();
        reader.push(&[kind::STDOUT, 0xff, 0xff, 0xff, 0xff]);
        assert!(reader.next_frame().is_err());
        for _ in 0..64 {
            reader.push(&[0; 1 << 16]);
        }
        assert!(reader.buffer.is_empty());
        assert!(matches!(reader.next_frame(), Err(DecodeError::TooLong(_))));
    }

    #[test]
    fn shell_status_follows_shell_conventions() {
        assert_eq!(Outcome::Exited(3).shell_status(), 3);
        assert_eq!(Outcome::Signaled(11).shell_status(), 139);
        assert_eq!(Outcome::NotFound.shell_status(), 127);
        assert_eq!(Outcome::NotExecutable.shell_status(), 126);
    }
}
