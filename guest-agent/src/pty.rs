//! Pseudo-terminals: a container's terminal is one on each side, the
//! runtime's on the host and the agent's in the guest; provm's `-t` and the
//! tests drive them the same way. Opened as openpty(3) opens them, given to
//! a command as its streams and controlling terminal, and sized.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::job::WindowSize;

/// A new pseudo-terminal's master and slave, of `size` if given (else 0 by
/// 0, until someone sets it).
pub fn open(size: Option<WindowSize>) -> io::Result<(OwnedFd, OwnedFd)> {
    let window = size.map(window);
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes the two descriptors it opens into `master`
    // and `slave`, and reads the size if one is given, which lives on this
    // stack for the call; the name and termios may be null.
    let opened = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            window.as_ref().map_or(std::ptr::null(), std::ptr::from_ref),
        )
    };
    if opened != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty has just opened both, and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) })
}

/// Gives `command` a terminal's `slave` as its standard input, output and
/// error, and as its controlling terminal in a session of its own: that
/// terminal's signals (SIGWINCH at a new size, SIGHUP at its hangup,
/// SIGINT at its Ctrl-C where the line discipline makes them) then go to
/// it. The command holds copies of the slave until it is dropped.
pub fn attach(command: &mut Command, slave: BorrowedFd<'_>) -> io::Result<()> {
    let stream = || slave.try_clone_to_owned().map(Stdio::from);
    command.stdin(stream()?).stdout(stream()?).stderr(stream()?);
    // SAFETY: between fork and exec the closure calls only setsid(2) and
    // ioctl(2), both async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// The size of the terminal `fd` is (either end). Async-signal-safe (an
/// OS error allocates nothing): provm's SIGWINCH handler calls it.
pub fn size(fd: BorrowedFd<'_>) -> io::Result<WindowSize> {
    // SAFETY: the TIOCGWINSZ ioctl writes only the winsize on this stack,
    // for the open descriptor `fd`.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WindowSize {
            rows: size.ws_row,
            columns: size.ws_col,
        })
    }
}

/// Gives the terminal `fd` is (either end) a new size: its foreground
/// processes get SIGWINCH, as a window's resize gives them.
pub fn resize(fd: BorrowedFd<'_>, size: WindowSize) -> io::Result<()> {
    let window = window(size);
    // SAFETY: the TIOCSWINSZ ioctl reads the winsize on this stack, for the
    // open descriptor `fd`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &window) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `size` as the kernel takes it.
fn window(size: WindowSize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows,
        ws_col: size.columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}
