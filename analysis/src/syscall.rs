//! System calls as an observer sees them: the x86-64 table of argument
//! kinds for the calls worth decoding, and their decoding from the guest's
//! saved registers and memory.
//!
//! `syscalls` names every call; which argument is a path, a descriptor or
//! a buffer is not in any crate, so the table below says it for the calls
//! that touch files and processes (the rest show their raw arguments).

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};
use syscalls::x86_64::Sysno;
use syscalls::Errno;

use crate::guest::{Guest, Task, AT_FDCWD};

/// The most argv or envp entries an execve shows.
const MAX_ARGV: usize = 256;
/// How many bytes of a buffer the text log quotes.
const QUOTED: usize = 32;

/// What a system call argument is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Hex,
    Octal,
    Fd,
    /// A directory descriptor of an `*at` call: `AT_FDCWD` or a descriptor.
    DirFd,
    /// A path, resolved against the preceding `DirFd` argument (or the
    /// working directory).
    Path,
    /// A string that is not a path (a symlink's target).
    Str,
    OpenFlags,
    /// A buffer the call reads from (write): as many bytes as it returns.
    InBuf,
    /// A buffer the call fills (read): as many bytes as it returns.
    OutBuf,
    /// A NULL-terminated array of strings (argv).
    Argv,
    /// A NULL-terminated array of `KEY=VALUE` strings (envp).
    Envp,
}

use Kind::*;

/// The argument kinds of the calls provm decodes.
fn kinds(call: Sysno) -> Option<&'static [Kind]> {
    Some(match call {
        Sysno::read | Sysno::pread64 => &[Fd, OutBuf, Int, Int],
        Sysno::write | Sysno::pwrite64 => &[Fd, InBuf, Int, Int],
        Sysno::open => &[Path, OpenFlags, Octal],
        Sysno::creat => &[Path, Octal],
        Sysno::close | Sysno::fsync | Sysno::fchdir | Sysno::dup => &[Fd],
        Sysno::stat | Sysno::lstat => &[Path, Hex],
        Sysno::fstat => &[Fd, Hex],
        Sysno::lseek => &[Fd, Int, Int],
        Sysno::mmap => &[Hex, Int, Hex, Hex, Fd, Int],
        Sysno::readv | Sysno::writev => &[Fd, Hex, Int],
        Sysno::access | Sysno::chmod | Sysno::mkdir => &[Path, Octal],
        Sysno::dup2 | Sysno::dup3 => &[Fd, Int, Hex],
        Sysno::sendfile => &[Fd, Fd, Hex, Int],
        Sysno::execve => &[Path, Argv, Envp],
        Sysno::execveat => &[DirFd, Path, Argv, Envp, Hex],
        Sysno::exit | Sysno::exit_group => &[Int],
        Sysno::wait4 => &[Int, Hex, Hex, Hex],
        Sysno::kill => &[Int, Int],
        Sysno::fcntl => &[Fd, Int, Hex],
        Sysno::truncate => &[Path, Int],
        Sysno::ftruncate => &[Fd, Int],
        Sysno::getdents64 => &[Fd, Hex, Int],
        Sysno::chdir | Sysno::rmdir | Sysno::unlink => &[Path],
        Sysno::rename | Sysno::link => &[Path, Path],
        Sysno::symlink => &[Str, Path],
        Sysno::readlink => &[Path, Hex, Int],
        Sysno::openat => &[DirFd, Path, OpenFlags, Octal],
        Sysno::mkdirat => &[DirFd, Path, Octal],
        Sysno::newfstatat => &[DirFd, Path, Hex, Hex],
        Sysno::unlinkat => &[DirFd, Path, Hex],
        Sysno::renameat => &[DirFd, Path, DirFd, Path],
        Sysno::renameat2 => &[DirFd, Path, DirFd, Path, Hex],
        Sysno::linkat => &[DirFd, Path, DirFd, Path, Hex],
        Sysno::symlinkat => &[Str, DirFd, Path],
        Sysno::readlinkat => &[DirFd, Path, Hex, Int],
        Sysno::faccessat | Sysno::faccessat2 => &[DirFd, Path, Octal, Hex],
        Sysno::statx => &[DirFd, Path, Hex, Hex, Hex],
        Sysno::clone => &[Hex, Hex, Hex, Hex, Hex],
        Sysno::clone3 => &[Hex, Int],
        Sysno::copy_file_range => &[Fd, Hex, Fd, Hex, Int, Hex],
        Sysno::pipe | Sysno::pipe2 => &[Hex, Hex],
        _ => return None,
    })
}

/// A decoded argument.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arg {
    Int {
        value: i64,
    },
    Hex {
        value: u64,
    },
    Octal {
        value: u64,
    },
    /// A descriptor and the file it referred to when the call was made.
    Fd {
        fd: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// A regular file (not a pipe, socket or terminal).
        regular: bool,
    },
    DirFd {
        fd: i64,
    },
    /// A path as the call got it, and resolved to an absolute one.
    Path {
        name: String,
        absolute: String,
    },
    Str {
        value: String,
    },
    OpenFlags {
        value: u64,
        names: String,
    },
    /// Bytes the call moved: how many, their SHA-256, and the bytes
    /// (kept for analyses that digest files, not serialised).
    Data {
        len: u64,
        sha256: String,
        #[serde(skip)]
        bytes: Vec<u8>,
    },
    Argv {
        values: Vec<String>,
    },
    /// An environment: shown as a count, as strace does.
    Env {
        values: Vec<String>,
    },
    /// Guest memory the argument points at could not be read.
    Unreadable {
        address: u64,
    },
}

/// A system call made and returned (or one that never returns: exit).
#[derive(Clone, Debug, Serialize)]
pub struct Syscall {
    pub task: Task,
    pub number: u64,
    pub name: String,
    pub args: Vec<Arg>,
    /// The return value; `None` for a call that did not return (exit).
    pub ret: Option<i64>,
    /// The log event index and guest time at entry and at return.
    pub entry_event: u64,
    pub entry_ns: u64,
    pub exit_event: u64,
    pub exit_ns: u64,
    /// The vCPU it was made on (a task may return on another).
    pub cpu: usize,
}

/// A call entered and not yet returned.
#[derive(Clone, Debug)]
pub struct Entered {
    pub task: Task,
    pub number: u64,
    pub(crate) raw: [u64; 6],
    args: Vec<Arg>,
    pub event: u64,
    pub guest_ns: u64,
    cpu: usize,
}

impl Entered {
    /// Decodes the call `number` with raw arguments `raw`, made by `task`
    /// (the `task_struct` at `task_address`): everything that must be read
    /// before the call runs (paths, descriptors, argv). Buffers wait for
    /// its return, when their length is known.
    pub fn decode(
        guest: &Guest,
        task_address: u64,
        task: Task,
        number: u64,
        raw: [u64; 6],
        (event, guest_ns): (u64, u64),
    ) -> Entered {
        let kinds = Sysno::new(number as usize).and_then(kinds);
        let args = match kinds {
            Some(kinds) => decode_entry(guest, task_address, kinds, &raw),
            None => raw.iter().map(|&value| Arg::Hex { value }).collect(),
        };
        Entered {
            task,
            number,
            raw,
            args,
            event,
            guest_ns,
            cpu: guest.view.vcpu,
        }
    }

    pub fn name(&self) -> String {
        Sysno::new(self.number as usize).map_or_else(
            || format!("syscall_{}", self.number),
            |call| call.name().to_owned(),
        )
    }

    /// The call as it returned `ret`, its buffers read.
    pub fn returned(mut self, guest: &Guest, ret: i64, (event, guest_ns): (u64, u64)) -> Syscall {
        let mut args = std::mem::take(&mut self.args);
        for (arg, &raw) in args.iter_mut().zip(&self.raw) {
            if matches!(arg, Arg::Data { .. }) {
                *arg =
                    data(guest, raw, ret.max(0) as u64).unwrap_or(Arg::Unreadable { address: raw });
            }
        }
        self.finish(args, Some(ret), (event, guest_ns))
    }

    /// The call as it ended without returning (exit, exit_group, a
    /// successful execve's caller is not this).
    pub fn never_returned(mut self, (event, guest_ns): (u64, u64)) -> Syscall {
        let args = std::mem::take(&mut self.args);
        self.finish(args, None, (event, guest_ns))
    }

    fn finish(self, args: Vec<Arg>, ret: Option<i64>, (event, guest_ns): (u64, u64)) -> Syscall {
        Syscall {
            name: self.name(),
            task: self.task,
            number: self.number,
            args,
            ret,
            entry_event: self.event,
            entry_ns: self.guest_ns,
            exit_event: event,
            exit_ns: guest_ns,
            cpu: self.cpu,
        }
    }
}

fn decode_entry(guest: &Guest, task: u64, kinds: &[Kind], raw: &[u64; 6]) -> Vec<Arg> {
    let mut dirfd = AT_FDCWD;
    kinds
        .iter()
        .zip(raw)
        .map(|(&kind, &value)| {
            let unreadable = Arg::Unreadable { address: value };
            match kind {
                Int => Arg::Int {
                    value: value as i64,
                },
                Hex => Arg::Hex { value },
                Octal => Arg::Octal { value },
                Fd => {
                    let fd = i64::from(value as i32);
                    let file = guest.open_file(task, fd).ok().flatten();
                    Arg::Fd {
                        fd,
                        regular: file.as_ref().is_some_and(|f| f.regular),
                        path: file.map(|f| f.path),
                    }
                }
                DirFd => {
                    dirfd = i64::from(value as i32);
                    Arg::DirFd { fd: dirfd }
                }
                Path => match guest.read_c_string(value) {
                    Ok(name) => {
                        let absolute = guest.resolve(task, dirfd, &name).unwrap_or(name.clone());
                        dirfd = AT_FDCWD;
                        Arg::Path { name, absolute }
                    }
                    Err(_) => unreadable,
                },
                Str => guest
                    .read_c_string(value)
                    .map_or(unreadable, |value| Arg::Str { value }),
                OpenFlags => Arg::OpenFlags {
                    value,
                    names: open_flags(value),
                },
                // Filled in at the return (`Entered::returned`).
                InBuf | OutBuf => Arg::Data {
                    len: 0,
                    sha256: String::new(),
                    bytes: Vec::new(),
                },
                Argv => guest
                    .read_string_array(value, MAX_ARGV)
                    .map_or(unreadable, |values| Arg::Argv { values }),
                Envp => guest
                    .read_string_array(value, MAX_ARGV)
                    .map_or(unreadable, |values| Arg::Env { values }),
            }
        })
        .collect()
}

/// `len` bytes at `address`, digested.
fn data(guest: &Guest, address: u64, len: u64) -> Option<Arg> {
    let bytes = guest.read_bytes(address, len as usize).ok()?;
    Some(Arg::Data {
        len,
        sha256: provm_trace::hex(&Sha256::digest(&bytes)),
        bytes,
    })
}

/// open(2) flags by name, as strace shows them.
fn open_flags(flags: u64) -> String {
    const NAMED: &[(u64, &str)] = &[
        (0o100, "O_CREAT"),
        (0o200, "O_EXCL"),
        (0o400, "O_NOCTTY"),
        (0o1000, "O_TRUNC"),
        (0o2000, "O_APPEND"),
        (0o4000, "O_NONBLOCK"),
        (0o200000, "O_DIRECTORY"),
        (0o400000, "O_NOFOLLOW"),
        (0o2000000, "O_CLOEXEC"),
        (0o10000000, "O_PATH"),
    ];
    let mut names = vec![match flags & 0o3 {
        0 => "O_RDONLY",
        1 => "O_WRONLY",
        _ => "O_RDWR",
    }
    .to_owned()];
    let mut rest = flags & !0o3;
    for &(bit, name) in NAMED {
        if rest & bit != 0 {
            names.push(name.to_owned());
            rest &= !bit;
        }
    }
    if rest != 0 {
        names.push(format!("{rest:#o}"));
    }
    names.join("|")
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Int { value } => write!(f, "{value}"),
            Arg::Hex { value } => write!(f, "{value:#x}"),
            Arg::Octal { value } => write!(f, "{value:#o}"),
            Arg::Fd { fd, path, .. } => match path {
                Some(path) => write!(f, "{fd}<{path}>"),
                None => write!(f, "{fd}"),
            },
            Arg::DirFd { fd } if *fd == AT_FDCWD => f.write_str("AT_FDCWD"),
            Arg::DirFd { fd } => write!(f, "{fd}"),
            Arg::Path { name, .. } | Arg::Str { value: name } => write!(f, "{name:?}"),
            Arg::OpenFlags { names, .. } => f.write_str(names),
            Arg::Data { bytes, .. } => {
                let quoted = &bytes[..bytes.len().min(QUOTED)];
                write!(f, "\"{}\"", quoted.escape_ascii())?;
                if bytes.len() > quoted.len() {
                    f.write_str("...")?;
                }
                Ok(())
            }
            Arg::Argv { values } => write!(f, "{values:?}"),
            Arg::Env { values } => write!(f, "/* {} vars */", values.len()),
            Arg::Unreadable { address } => write!(f, "{address:#x} (unreadable)"),
        }
    }
}

impl fmt::Display for Syscall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self.args.iter().map(ToString::to_string).collect();
        write!(f, "{}({})", self.name, args.join(", "))?;
        match self.ret {
            None => f.write_str(" = ?"),
            Some(ret) if (-4095..0).contains(&ret) => {
                let errno = Errno::new(-ret as i32);
                write!(f, " = -1 {}", errno.name().unwrap_or("E?"))
            }
            Some(ret) => write!(f, " = {ret}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_read_as_strace_shows_them() {
        assert_eq!(open_flags(0), "O_RDONLY");
        assert_eq!(open_flags(0o1101), "O_WRONLY|O_CREAT|O_TRUNC");
        assert_eq!(open_flags(0o2000002), "O_RDWR|O_CLOEXEC");
    }

    #[test]
    fn a_failed_call_shows_its_errno_by_name() {
        let call = Syscall {
            task: Task {
                pid: 7,
                tid: 7,
                ppid: 1,
                comm: "cat".into(),
            },
            number: 257,
            name: "openat".into(),
            args: vec![
                Arg::DirFd { fd: AT_FDCWD },
                Arg::Path {
                    name: "in".into(),
                    absolute: "/in".into(),
                },
                Arg::OpenFlags {
                    value: 0,
                    names: "O_RDONLY".into(),
                },
            ],
            ret: Some(-2),
            entry_event: 0,
            entry_ns: 0,
            exit_event: 0,
            exit_ns: 0,
            cpu: 0,
        };
        assert_eq!(
            call.to_string(),
            "openat(AT_FDCWD, \"in\", O_RDONLY) = -1 ENOENT"
        );
    }
}
