//! What the host asks the agent to run, and how it ended.

use crate::codec::{put_bytes, put_u32, put_u64, DecodeError, Reader};

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
    /// The command runs on a terminal of this size in the guest (a
    /// container's `process.terminal`): its standard input, output and
    /// error are the terminal, and its output comes back as stdout, the
    /// terminal's line discipline applied. `None`: pipes.
    pub terminal: Option<WindowSize>,
}

/// A terminal's size, in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSize {
    pub rows: u16,
    pub columns: u16,
}

impl WindowSize {
    pub(crate) fn encode(self, out: &mut Vec<u8>) {
        put_u32(out, self.rows.into());
        put_u32(out, self.columns.into());
    }

    pub(crate) fn decode(reader: &mut Reader<'_>) -> Result<WindowSize, DecodeError> {
        let mut dimension = || {
            u16::try_from(reader.u32()?).map_err(|_| DecodeError::Malformed("a terminal's size"))
        };
        Ok(WindowSize {
            rows: dimension()?,
            columns: dimension()?,
        })
    }

    /// A flag, then the size if it is set.
    pub(crate) fn decode_optional(
        reader: &mut Reader<'_>,
    ) -> Result<Option<WindowSize>, DecodeError> {
        match reader.bool()? {
            true => WindowSize::decode(reader).map(Some),
            false => Ok(None),
        }
    }
}

impl Job {
    /// Encodes the fields that came after `outputs`, in the order they
    /// came, up to the last one that is not its default: a job that uses
    /// none of the later ones encodes as jobs did before they existed, so
    /// older agents' traces keep their bytes (and a decoder stops where
    /// the bytes end).
    pub(crate) fn encode_optional_fields(&self, out: &mut Vec<u8>) {
        let mut fields: Vec<(bool, Vec<u8>)> = Vec::new();
        let mut field = |set: bool, write: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = Vec::new();
            write(&mut bytes);
            fields.push((set, bytes));
        };
        field(!self.user.is_empty(), &|out| put_bytes(out, &self.user));
        field(self.input_disk, &|out| out.push(self.input_disk.into()));
        let limits = !self.hostname.is_empty() || !self.rlimits.is_empty();
        field(limits, &|out| {
            put_bytes(out, &self.hostname);
            put_u64(out, self.rlimits.len() as u64);
            for limit in &self.rlimits {
                put_u64(out, limit.resource.into());
                put_u64(out, limit.soft);
                put_u64(out, limit.hard);
            }
        });
        field(self.live_stdin, &|out| out.push(self.live_stdin.into()));
        field(self.leave_root_clean, &|out| {
            out.push(self.leave_root_clean.into())
        });
        field(self.terminal.is_some(), &|out| {
            out.push(self.terminal.is_some().into());
            self.terminal.into_iter().for_each(|size| size.encode(out));
        });
        let used = fields
            .iter()
            .rposition(|(set, _)| *set)
            .map_or(0, |last| last + 1);
        fields[..used]
            .iter()
            .for_each(|(_, bytes)| out.extend_from_slice(bytes));
    }
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
