//! `--console-socket`: the container's terminal. As runc does, the
//! runtime makes a pseudo-terminal, sends its master over the unix socket
//! (SCM_RIGHTS) to whoever listens there (conmon, for `podman run -t`),
//! and gives the slave to the container's process as its standard streams.
//! It is raw: the command's terminal is the guest's.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use provm_engine::transfer::terminal;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub struct Terminal {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// A new pseudo-terminal, raw, both ends closed on exec.
pub fn open() -> io::Result<Terminal> {
    let (master, slave) = provm_guest_agent::pty::open(None)?;
    let terminal = Terminal { master, slave };
    crate::fds::close_on_exec(terminal.master.as_raw_fd())?;
    crate::fds::close_on_exec(terminal.slave.as_raw_fd())?;
    terminal::make_raw(terminal.slave.as_fd(), false)?;
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
