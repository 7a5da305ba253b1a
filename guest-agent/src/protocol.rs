//! The agent channel's wire format, shared by the host (provm) and the guest
//! agent.
//!
//! The channel is a byte stream (the guest's virtio console, /dev/hvc0, in raw
//! mode). Every message is one frame: a kind byte, a little-endian u32 payload
//! length, then the payload. Payload fields are length-prefixed byte strings
//! and little-endian integers, so the agent needs no serialisation library
//! (it is copied into guest memory at every boot, so every kilobyte counts).

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
    /// The command ended; its output has all been sent.
    Finished(Outcome),
    /// The agent could not run the job (the root would not mount, ...).
    Failed(Vec<u8>),
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
    pub const READY: u8 = 0x81;
    pub const STDOUT: u8 = 0x82;
    pub const STDERR: u8 = 0x83;
    pub const FINISHED: u8 = 0x84;
    pub const FAILED: u8 = 0x85;
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
                kind::RUN
            }
            HostMessage::PowerOff => kind::POWER_OFF,
        };
        frame(kind, &payload)
    }

    pub fn decode(kind: u8, payload: &[u8]) -> Result<Self, DecodeError> {
        let mut reader = Reader(payload);
        let message = match kind {
            kind::RUN => HostMessage::Run(Job {
                argv: reader.list()?,
                env: reader.list()?,
                cwd: reader.bytes()?,
                root_device: reader.bytes()?,
                entropy: reader.bytes()?,
            }),
            kind::POWER_OFF => HostMessage::PowerOff,
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
            GuestMessage::Finished(outcome) => {
                let (tag, value) = match *outcome {
                    Outcome::Exited(code) => (outcome_tag::EXITED, code),
                    Outcome::Signaled(signal) => (outcome_tag::SIGNALED, signal),
                    Outcome::NotFound => (outcome_tag::NOT_FOUND, 0),
                    Outcome::NotExecutable => (outcome_tag::NOT_EXECUTABLE, 0),
                };
                payload.push(tag);
                payload.extend_from_slice(&value.to_le_bytes());
                kind::FINISHED
            }
            GuestMessage::Failed(reason) => {
                payload.extend_from_slice(reason);
                kind::FAILED
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
            kind::FINISHED => {
                let mut reader = Reader(payload);
                let tag = reader.u8()?;
                let value = reader.u32()? as i32;
                let outcome = match tag {
                    outcome_tag::EXITED => Outcome::Exited(value),
                    outcome_tag::SIGNALED => Outcome::Signaled(value),
                    outcome_tag::NOT_FOUND => Outcome::NotFound,
                    outcome_tag::NOT_EXECUTABLE => Outcome::NotExecutable,
                    other => return Err(DecodeError::UnknownKind(other)),
                };
                return reader.finish(GuestMessage::Finished(outcome));
            }
            other => return Err(DecodeError::UnknownKind(other)),
        };
        Reader(payload).finish(message)
    }
}

/// Splits a byte stream into frames; feed it bytes as they arrive.
#[derive(Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
}

impl FrameReader {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame as (kind, payload), if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, DecodeError> {
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buffer[1..HEADER_LEN].try_into().unwrap()) as usize;
        if len > MAX_PAYLOAD {
            return Err(DecodeError::TooLong(len));
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

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_list(out: &mut Vec<u8>, items: &[Vec<u8>]) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        put_bytes(out, item);
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, len: usize) -> Result<&[u8], DecodeError> {
        if self.0.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
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

    #[test]
    fn run_job_round_trips() {
        let job = HostMessage::Run(Job {
            argv: vec![b"/bin/sh".to_vec(), b"-c".to_vec(), b"echo hi".to_vec()],
            env: vec![b"PATH=/bin".to_vec()],
            cwd: b"/".to_vec(),
            root_device: b"/dev/vda".to_vec(),
            entropy: vec![7; 32],
        });
        let mut reader = FrameReader::default();
        reader.push(&job.encode());
        let (kind, payload) = reader.next_frame().unwrap().unwrap();
        assert_eq!(HostMessage::decode(kind, &payload).unwrap(), job);
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

    #[test]
    fn shell_status_follows_shell_conventions() {
        assert_eq!(Outcome::Exited(3).shell_status(), 3);
        assert_eq!(Outcome::Signaled(11).shell_status(), 139);
        assert_eq!(Outcome::NotFound.shell_status(), 127);
        assert_eq!(Outcome::NotExecutable.shell_status(), 126);
    }
}
