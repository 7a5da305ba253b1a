//! The provenance model: the facts of a job's provenance (processes, file
//! versions, environments and the relations between them) as records, the
//! one form that the agent's in-guest tracer (guest-agent's `provenance`),
//! the host's replay (src/provenance's `replay`) and the host's graph
//! (src/provenance's `capture`) share; their wire form; and how a tracer
//! assembles them (`relations`) and numbers the file versions they name
//! (`versions`).

mod relations;
mod versions;

pub use relations::{assemble, Relations};
pub use versions::{Change, PathState, Versions};

use crate::codec::{put_bytes, put_list, put_u32, put_u64, DecodeError, Reader};
use crate::job::Outcome;

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

impl ProvRecord {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
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
                Outcome::encode_optional(process.outcome, out);
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

    pub(crate) fn decode(reader: &mut Reader<'_>) -> Result<ProvRecord, DecodeError> {
        Ok(match reader.u8()? {
            record_tag::ENVIRONMENT => ProvRecord::Environment {
                id: reader.u32()?,
                entries: reader.list()?,
            },
            record_tag::FILE => ProvRecord::File(FileVersion {
                id: reader.u32()?,
                path: reader.bytes()?,
                sha256: reader.bytes()?,
                size: reader.u64()?,
            }),
            record_tag::PROCESS => ProvRecord::Process(Process {
                id: reader.u32()?,
                pid: reader.u32()?,
                exe: reader.bytes()?,
                argv: reader.list()?,
                env: reader.u32()?,
                start_ns: reader.u64()?,
                end_ns: reader.u64()?,
                outcome: Outcome::decode_optional(reader)?,
            }),
            record_tag::STARTED => ProvRecord::Started {
                process: reader.u32()?,
                starter: reader.u32()?,
                exec: reader.bool()?,
            },
            record_tag::USED => ProvRecord::Used {
                process: reader.u32()?,
                file: reader.u32()?,
                execute: reader.bool()?,
                seq: reader.u64()?,
            },
            record_tag::GENERATED => ProvRecord::Generated {
                file: reader.u32()?,
                process: reader.u32()?,
                seq: reader.u64()?,
            },
            record_tag::DERIVED => ProvRecord::Derived {
                file: reader.u32()?,
                from: reader.u32()?,
                process: reader.u32()?,
            },
            record_tag::INVALIDATED => ProvRecord::Invalidated {
                file: reader.u32()?,
                process: reader.u32()?,
                seq: reader.u64()?,
            },
            other => return Err(DecodeError::UnknownKind(other)),
        })
    }
}
