//! `--console-socket`: the container's terminal. As runc does, the
//! runtime makes a pseudo-terminal, sends its master over the unix socket
//! (SCM_RIGHTS) to whoever listens there (conmon, for `podman run -t`),
//! and gives the slave to the container's process as its standard streams.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub struct Terminal {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// A new pseudo-terminal, both ends closed on exec.
pub fn open() -> io::Result<Terminal> {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes the two descriptors it opens into the two
    // integers it is given; the name, termios and size may be null.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if opened != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty has just opened both, and nothing else owns them.
    let terminal = unsafe {
        Terminal {
            master: OwnedFd::from_raw_fd(master),
            slave: OwnedFd::from_raw_fd(slave),
        }
    };
    crate::fds::close_on_exec(terminal.master.as_raw_fd())?;
    crate::fds::close_on_exec(terminal.slave.as_raw_fd())?;
    Ok(terminal)
}

/// Sends `master` to the listener at `socket`.
pub fn send(socket: &Path, master: &OwnedFd) -> Result<(), String> {
    let failed = |error: &dyn std::fmt::Display| {
        format!(
            "cannot send the terminal to the console socket {}: {error}",
            socket.display()
        )
    };
    let stream = UnixStream::connect(socket).map_err(|e| failed(&e))?;
    stream
        .send_with_fd(&b"/dev/ptmx"[..], master.as_raw_fd())
        .map_err(|e| failed(&e))?;
    Ok(())
}
