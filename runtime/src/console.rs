//! `--console-socket`: the container's terminal. As runc does, the
//! runtime makes a pseudo-terminal, sends its master over the unix socket
//! (SCM_RIGHTS) to whoever listens there (conmon, for `podman run -t`),
//! and gives the slave to the container's process as its standard streams.
//! It is raw: the command's terminal is the guest's.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use provm_guest_agent::WindowSize;
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
    make_raw(&terminal.slave)?;
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

/// The size of the container's terminal, the process's standard input,
/// for the guest's.
pub fn window_size() -> io::Result<WindowSize> {
    // SAFETY: the TIOCGWINSZ ioctl writes only the winsize on this stack,
    // for the open descriptor 0.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(io::stdin().as_raw_fd(), libc::TIOCGWINSZ, &mut size) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WindowSize {
            rows: size.ws_row,
            columns: size.ws_col,
        })
    }
}

/// Sets the terminal whose slave is `slave` raw, before anyone types at
/// it: what is typed passes on unchanged to the command's terminal in the
/// guest, whose line discipline echoes and edits it (and turns Ctrl-C
/// into a SIGINT there), and the guest's output, its lines already ended
/// CR LF, comes out as it is.
fn make_raw(slave: &OwnedFd) -> io::Result<()> {
    // SAFETY: tcgetattr, cfmakeraw and tcsetattr read and write only the
    // termios on this stack, for the open descriptor `slave`.
    unsafe {
        let mut settings: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(slave.as_raw_fd(), &mut settings) < 0 {
            return Err(io::Error::last_os_error());
        }
        libc::cfmakeraw(&mut settings);
        if libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &settings) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
