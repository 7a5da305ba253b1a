//! The descriptors the container's process inherits: its three standard
//! streams only. An engine hands the runtime pipes of its own (conmon's
//! `_OCI_SYNCPIPE` and `_OCI_STARTPIPE`) and waits for them to close; the
//! container's process, which outlives `create`, must not hold them.

use std::io;
use std::os::fd::RawFd;

/// Marks every descriptor above the standard streams close-on-exec.
pub fn close_inherited_on_exec() -> io::Result<()> {
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in open {
        // The listing's own descriptor is closed by now: EBADF is fine.
        match close_on_exec(fd) {
            Err(error) if error.raw_os_error() == Some(libc::EBADF) => {}
            other => other?,
        }
    }
    Ok(())
}

pub fn close_on_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_SETFD on a descriptor number changes only its flags; an
    // invalid one fails with EBADF.
    match unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } {
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}
