//! The traced system calls, decoded from a tracee's registers at its
//! seccomp stop, with their paths made absolute.

use std::io;

use provm_guest_agent::paths::normalize;

use super::ptrace::{self, Pid};

/// A traced call, its paths absolute and lexically normal.
#[derive(Debug, PartialEq, Eq)]
pub enum Call {
    Open {
        path: Vec<u8>,
        flags: i32,
    },
    Truncate {
        path: Vec<u8>,
    },
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Link {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Unlink {
        path: Vec<u8>,
    },
    /// chdir or fchdir: the new directory is read once the call succeeded.
    Chdir,
}

impl Call {
    /// Whether the call's effect is recorded only once it succeeded.
    pub fn needs_result(&self) -> bool {
        !matches!(self, Call::Open { .. } | Call::Truncate { .. })
    }
}

/// The call a tracee stopped at, or `None` for one that names no file
/// (unlinkat of a directory, renameat2 with RENAME_EXCHANGE, O_PATH and
/// directory opens). `cwd` is the process's working directory.
pub fn decode(pid: Pid, regs: &libc::user_regs_struct, cwd: &[u8]) -> io::Result<Option<Call>> {
    let args = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8];
    let path = |dirfd: u64, address: u64| -> io::Result<Vec<u8>> {
        let name = ptrace::read_string(pid, address)?;
        resolve(pid, cwd, dirfd as i32, &name)
    };
    let here = libc::AT_FDCWD as u64;
    let call = match regs.orig_rax as libc::c_long {
        libc::SYS_open => open(path(here, args[0])?, args[1] as i32),
        libc::SYS_creat => open(
            path(here, args[0])?,
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
        ),
        libc::SYS_openat => open(path(args[0], args[1])?, args[2] as i32),
        // struct open_how starts with the u64 flags.
        libc::SYS_openat2 => open(
            path(args[0], args[1])?,
            ptrace::read_u64(pid, args[2])? as i32,
        ),
        libc::SYS_truncate => Some(Call::Truncate {
            path: path(here, args[0])?,
        }),
        libc::SYS_rename => Some(Call::Rename {
            from: path(here, args[0])?,
            to: path(here, args[1])?,
        }),
        libc::SYS_renameat => Some(Call::Rename {
            from: path(args[0], args[1])?,
            to: path(args[2], args[3])?,
        }),
        libc::SYS_renameat2 if args[4] as u32 & libc::RENAME_EXCHANGE != 0 => None,
        libc::SYS_renameat2 => Some(Call::Rename {
            from: path(args[0], args[1])?,
            to: path(args[2], args[3])?,
        }),
        libc::SYS_link => Some(Call::Link {
            from: path(here, args[0])?,
            to: path(here, args[1])?,
        }),
        libc::SYS_linkat => Some(Call::Link {
            from: path(args[0], args[1])?,
            to: path(args[2], args[3])?,
        }),
        libc::SYS_unlink => Some(Call::Unlink {
            path: path(here, args[0])?,
        }),
        libc::SYS_unlinkat if args[2] as i32 & libc::AT_REMOVEDIR != 0 => None,
        libc::SYS_unlinkat => Some(Call::Unlink {
            path: path(args[0], args[1])?,
        }),
        libc::SYS_chdir | libc::SYS_fchdir => Some(Call::Chdir),
        _ => None,
    };
    Ok(call)
}

fn open(path: Vec<u8>, flags: i32) -> Option<Call> {
    (flags & (libc::O_PATH | libc::O_DIRECTORY) == 0).then_some(Call::Open { path, flags })
}

/// `name` made absolute: against `cwd`, or the directory `dirfd` is open on.
fn resolve(pid: Pid, cwd: &[u8], dirfd: i32, name: &[u8]) -> io::Result<Vec<u8>> {
    if name.starts_with(b"/") {
        return Ok(normalize(b"/", name));
    }
    if dirfd == libc::AT_FDCWD {
        return Ok(normalize(cwd, name));
    }
    let base = ptrace::proc_link(pid, &format!("fd/{dirfd}"))?;
    Ok(normalize(&base, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_decoded_from_registers() {
        let name = c"in.txt";
        let pid = std::process::id() as Pid;
        // SAFETY: user_regs_struct is plain integers: all-zero is valid.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.orig_rax = libc::SYS_openat as u64;
        regs.rdi = libc::AT_FDCWD as u64;
        regs.rsi = name.as_ptr() as u64;
        regs.rdx = libc::O_RDONLY as u64;
        let call = decode(pid, &regs, b"/data").unwrap();
        assert_eq!(
            call,
            Some(Call::Open {
                path: b"/data/in.txt".to_vec(),
                flags: libc::O_RDONLY
            })
        );
        regs.rdx = (libc::O_RDONLY | libc::O_DIRECTORY) as u64;
        assert_eq!(decode(pid, &regs, b"/").unwrap(), None);

        regs.orig_rax = libc::SYS_unlinkat as u64;
        regs.rdx = 0;
        let call = decode(pid, &regs, b"/tmp").unwrap();
        assert_eq!(
            call,
            Some(Call::Unlink {
                path: b"/tmp/in.txt".to_vec()
            })
        );
        assert!(call.unwrap().needs_result());
        regs.rdx = libc::AT_REMOVEDIR as u64;
        assert_eq!(decode(pid, &regs, b"/").unwrap(), None);
    }
}
