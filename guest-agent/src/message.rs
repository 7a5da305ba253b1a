//! The messages of the agent channel, each way, and their frames.

use crate::codec::{
    frame, frame_head, put_bytes, put_list, put_u64, DecodeError, FrameReader, Reader, MAX_PAYLOAD,
};
use crate::job::{Job, Outcome, Rlimit, WindowSize};
use crate::records::ProvRecord;
use crate::tree::Entry;

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
    /// Part of the command's standard input: before DataEnd when it is
    /// sent whole (see [`Job::stdin`]), after it when it is live (see
    /// [`Job::live_stdin`]).
    Stdin(Vec<u8>),
    /// The live standard input has ended: the command's pipe closes once
    /// what came before is written.
    StdinEnd,
    /// Every input and all of standard input has been sent: the command
    /// may start.
    DataEnd,
    /// Send this signal to the command (a container runtime's `kill`): at
    /// once if it runs, as it starts if it has not yet; after it ended,
    /// nothing. Linux's signals are numbered 1 to 64.
    Signal(u8),
    /// The command's terminal (see [`Job::terminal`]) takes this size, as
    /// the host's did (SIGWINCH); without one, nothing.
    Resize(WindowSize),
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
    /// or a [`HostMessage::Stdin`]), or written a live one to the command's
    /// pipe: the host's flow control, which keeps a
    /// bounded number of them in flight.
    Received,
    /// Part of an output (see [`Job::outputs`]), after the command ended.
    Entry(Entry),
}

mod kind {
    pub const RUN: u8 = 1;
    pub const POWER_OFF: u8 = 2;
    pub const ENTRY: u8 = 3;
    pub const STDIN: u8 = 4;
    pub const DATA_END: u8 = 5;
    pub const SIGNAL: u8 = 6;
    pub const STDIN_END: u8 = 7;
    pub const RESIZE: u8 = 8;
    pub const READY: u8 = 0x81;
    pub const STDOUT: u8 = 0x82;
    pub const STDERR: u8 = 0x83;
    pub const FINISHED: u8 = 0x84;
    pub const FAILED: u8 = 0x85;
    pub const PROVENANCE: u8 = 0x86;
    pub const RECEIVED: u8 = 0x87;
    pub const OUTPUT_ENTRY: u8 = 0x88;
}

impl HostMessage {
    pub fn encode(&self) -> Vec<u8> {
        let (mut frame, tail) = self.encoded_parts();
        frame.extend_from_slice(tail);
        frame
    }

    /// The message's frame in two parts: all of it but the bytes a `Data`
    /// entry or standard input carries, then those bytes. `encode` is the
    /// two together; digesting them apart spares copying large data.
    pub fn encoded_parts(&self) -> (Vec<u8>, &[u8]) {
        let mut payload = Vec::new();
        let mut tail: &[u8] = &[];
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
                job.encode_optional_fields(&mut payload);
                kind::RUN
            }
            HostMessage::PowerOff => kind::POWER_OFF,
            HostMessage::Entry(entry) => {
                tail = entry.encode_head(&mut payload);
                kind::ENTRY
            }
            HostMessage::Stdin(bytes) => {
                tail = bytes;
                kind::STDIN
            }
            HostMessage::DataEnd => kind::DATA_END,
            HostMessage::StdinEnd => kind::STDIN_END,
            HostMessage::Signal(signal) => {
                payload.push(*signal);
                kind::SIGNAL
            }
            HostMessage::Resize(size) => {
                size.encode(&mut payload);
                kind::RESIZE
            }
        };
        (frame_head(kind, &payload, tail.len()), tail)
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
            HostMessage::Entry(_)
                | HostMessage::Stdin(_)
                | HostMessage::DataEnd
                | HostMessage::StdinEnd
        )
    }

    pub fn decode(kind: u8, payload: &[u8]) -> Result<Self, DecodeError> {
        let mut reader = Reader::new(payload);
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
                if !reader.is_empty() {
                    job.inputs = reader.list()?;
                    job.stdin = reader.bool()?;
                    job.outputs = reader.list()?;
                }
                // A job run as root ends here too (see `encode`), and
                // one with no input disk after its user.
                if !reader.is_empty() {
                    job.user = reader.bytes()?;
                }
                if !reader.is_empty() {
                    job.input_disk = reader.bool()?;
                }
                if !reader.is_empty() {
                    job.hostname = reader.bytes()?;
                    for _ in 0..reader.u64()? {
                        job.rlimits.push(Rlimit {
                            resource: u32::try_from(reader.u64()?)
                                .map_err(|_| DecodeError::Malformed("a resource limit's number"))?,
                            soft: reader.u64()?,
                            hard: reader.u64()?,
                        });
                    }
                }
                if !reader.is_empty() {
                    job.live_stdin = reader.bool()?;
                }
                if !reader.is_empty() {
                    job.leave_root_clean = reader.bool()?;
                }
                if !reader.is_empty() {
                    job.terminal = WindowSize::decode_optional(&mut reader)?;
                }
                HostMessage::Run(job)
            }
            kind::POWER_OFF => HostMessage::PowerOff,
            kind::ENTRY => HostMessage::Entry(Entry::decode(&mut reader)?),
            kind::STDIN => return Ok(HostMessage::Stdin(payload.to_vec())),
            kind::DATA_END => HostMessage::DataEnd,
            kind::STDIN_END => HostMessage::StdinEnd,
            kind::SIGNAL => HostMessage::Signal(reader.u8()?),
            kind::RESIZE => HostMessage::Resize(WindowSize::decode(&mut reader)?),
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
                    record.encode(&mut payload);
                }
                kind::PROVENANCE
            }
            GuestMessage::Finished(outcome) => {
                outcome.encode(&mut payload);
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
                let mut reader = Reader::new(payload);
                let mut records = Vec::new();
                while !reader.is_empty() {
                    records.push(ProvRecord::decode(&mut reader)?);
                }
                return Ok(GuestMessage::Provenance(records));
            }
            kind::FINISHED => {
                let mut reader = Reader::new(payload);
                let outcome = Outcome::decode(&mut reader)?;
                return reader.finish(GuestMessage::Finished(outcome));
            }
            kind::RECEIVED => GuestMessage::Received,
            kind::OUTPUT_ENTRY => {
                let mut reader = Reader::new(payload);
                let entry = Entry::decode(&mut reader)?;
                return reader.finish(GuestMessage::Entry(entry));
            }
            other => return Err(DecodeError::UnknownKind(other)),
        };
        Reader::new(payload).finish(message)
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
        record.encode(&mut encoded);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::HEADER_LEN;
    use crate::records::{FileVersion, Process};
    use crate::tree::EntryContent;

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
        let as_root_by_disk = Job {
            input_disk: true,
            ..Job::default()
        };
        let root_kept = Job {
            leave_root_clean: true,
            ..Job::default()
        };
        // A terminal never sized is 0 by 0, still a terminal.
        let on_a_terminal = Job {
            terminal: Some(WindowSize {
                rows: 0,
                columns: 0,
            }),
            ..Job::default()
        };
        for job in [as_root_by_disk, root_kept, on_a_terminal] {
            let job = HostMessage::Run(job);
            let mut reader = FrameReader::default();
            reader.push(&job.encode());
            let (kind, payload) = reader.next_frame().unwrap().unwrap();
            assert_eq!(HostMessage::decode(kind, &payload).unwrap(), job);
        }
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
            input_disk: false,
            live_stdin: false,
            hostname: b"box".to_vec(),
            rlimits: vec![Rlimit {
                resource: 7,
                soft: 1024,
                hard: u64::MAX,
            }],
            leave_root_clean: true,
            terminal: Some(WindowSize {
                rows: 24,
                columns: 80,
            }),
        });
        let mut reader = FrameReader::default();
        reader.push(&job.encode());
        let (kind, payload) = reader.next_frame().unwrap().unwrap();
        assert_eq!(HostMessage::decode(kind, &payload).unwrap(), job);
    }

    /// A job with live stdin encodes every optional field before its flag;
    /// one without encodes as jobs did before the flag.
    #[test]
    fn a_live_stdin_job_round_trips_and_others_keep_their_bytes() {
        let plain = Job {
            argv: vec![b"head".to_vec()],
            hostname: b"box".to_vec(),
            ..Job::default()
        };
        let live = Job {
            live_stdin: true,
            ..plain.clone()
        };
        let (plain, live) = (HostMessage::Run(plain), HostMessage::Run(live));
        assert_eq!(live.encode().len(), plain.encode().len() + 1);
        for job in [
            plain,
            live,
            HostMessage::Run(Job {
                live_stdin: true,
                ..Job::default()
            }),
        ] {
            assert_eq!(HostMessage::of_frame(&job.encode()), Some(job));
        }
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
            HostMessage::StdinEnd,
            HostMessage::Signal(15),
            HostMessage::Entry(Entry {
                tree: 1,
                path: b"sub/x.csv".to_vec(),
                content: EntryContent::File { mode: 0o644 },
            }),
            HostMessage::Entry(Entry {
                tree: 1,
                path: b"sub/x.csv".to_vec(),
                content: EntryContent::Data(b"1,2\n".to_vec()),
            }),
        ] {
            let (head, tail) = message.encoded_parts();
            assert_eq!([head, tail.to_vec()].concat(), message.encode());
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

    /// Input digests are of these bytes (a trace's manifest, the input
    /// disk's cache key): they must not change.
    #[test]
    fn a_data_entry_encodes_as_it_always_has() {
        let message = HostMessage::Entry(Entry {
            tree: 1,
            path: b"a".to_vec(),
            content: EntryContent::Data(vec![9, 8]),
        });
        let payload = [&[1, 0, 0, 0, 1, 0, 0, 0, b'a', 2, 2, 0, 0, 0, 9, 8][..]].concat();
        let frame = [&[kind::ENTRY, 16, 0, 0, 0][..], &payload].concat();
        assert_eq!(message.encode(), frame);
        let (head, tail) = message.encoded_parts();
        assert_eq!((&head[..], tail), (&frame[..frame.len() - 2], &[9, 8][..]));
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
}
