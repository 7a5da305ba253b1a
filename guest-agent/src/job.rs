//! What the host asks the agent to run, and how it ended.

use crate::codec::{DecodeError, Reader};

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
    /// [`HostMessage::Entry`] messages, unless `input_disk`.
    pub inputs: Vec<Vec<u8>>,
    /// The inputs are on the input disk (/dev/vdb, an ext4 file system
    /// holding input N at /N), not on the channel.
    pub input_disk: bool,
    /// The command's standard input follows the job as
    /// [`HostMessage::Stdin`] messages; without it, /dev/null.
    pub stdin: bool,
    /// The command's standard input is a pipe the host feeds as it runs
    /// (the host's own is a pipe or a terminal): [`HostMessage::Stdin`]
    /// messages after DataEnd, each acknowledged once written to the pipe,
    /// then [`HostMessage::StdinEnd`].
    pub live_stdin: bool,
    /// What comes back after the command: each of these guest paths (a
    /// directory made empty beforehand when missing) is sent as
    /// [`GuestMessage::Entry`] messages before Finished.
    pub outputs: Vec<Vec<u8>>,
    /// Who the command runs as: `USER[:GROUP]`, each a name (looked up in
    /// the image's /etc/passwd and /etc/group) or a number, as a container
    /// image's `User` says it; empty: root.
    pub user: Vec<u8>,
    /// The host name the guest takes before the command starts (a
    /// container's `hostname`); empty: the guest keeps its own.
    pub hostname: Vec<u8>,
    /// The resource limits the command starts with (a container's
    /// `rlimits`); the others stay the guest's defaults.
    pub rlimits: Vec<Rlimit>,
    /// The root's disk is read after the run as a disk (`--keep-overlay`):
    /// leave its file system clean at power-off, its journal written
    /// back. Otherwise the agent only syncs it: the disk is thrown away
    /// with the guest, or read by one that replays the journal itself (a
    /// container's write-back).
    pub leave_root_clean: bool,
}

/// A resource limit, as setrlimit(2) takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rlimit {
    /// Linux's number for the resource (`RLIMIT_NOFILE` is 7).
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
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

mod outcome_tag {
    pub const EXITED: u8 = 0;
    pub const SIGNALED: u8 = 1;
    pub const NOT_FOUND: u8 = 2;
    pub const NOT_EXECUTABLE: u8 = 3;
}

/// Tag 0xff stands for no outcome (a process that went on with exec).
const NO_OUTCOME: u8 = 0xff;

impl Outcome {
    pub(crate) fn encode(self, out: &mut Vec<u8>) {
        let (tag, value) = match self {
            Outcome::Exited(code) => (outcome_tag::EXITED, code),
            Outcome::Signaled(signal) => (outcome_tag::SIGNALED, signal),
            Outcome::NotFound => (outcome_tag::NOT_FOUND, 0),
            Outcome::NotExecutable => (outcome_tag::NOT_EXECUTABLE, 0),
        };
        out.push(tag);
        out.extend_from_slice(&value.to_le_bytes());
    }

    /// An outcome, or [`NO_OUTCOME`] for none.
    pub(crate) fn encode_optional(outcome: Option<Outcome>, out: &mut Vec<u8>) {
        match outcome {
            Some(outcome) => outcome.encode(out),
            None => out.push(NO_OUTCOME),
        }
    }

    pub(crate) fn decode(reader: &mut Reader<'_>) -> Result<Outcome, DecodeError> {
        Outcome::decode_optional(reader)?.ok_or(DecodeError::UnknownKind(NO_OUTCOME))
    }

    /// An outcome, or `None` for [`NO_OUTCOME`].
    pub(crate) fn decode_optional(reader: &mut Reader<'_>) -> Result<Option<Outcome>, DecodeError> {
        let tag = reader.u8()?;
        if tag == NO_OUTCOME {
            return Ok(None);
        }
        let value = reader.u32()? as i32;
        Ok(Some(match tag {
            outcome_tag::EXITED => Outcome::Exited(value),
            outcome_tag::SIGNALED => Outcome::Signaled(value),
            outcome_tag::NOT_FOUND => Outcome::NotFound,
            outcome_tag::NOT_EXECUTABLE => Outcome::NotExecutable,
            other => return Err(DecodeError::UnknownKind(other)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_status_follows_shell_conventions() {
        assert_eq!(Outcome::Exited(3).shell_status(), 3);
        assert_eq!(Outcome::Signaled(11).shell_status(), 139);
        assert_eq!(Outcome::NotFound.shell_status(), 127);
        assert_eq!(Outcome::NotExecutable.shell_status(), 126);
    }
}
