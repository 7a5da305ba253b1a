//! A pseudo-terminal pair, as openpty(3) opens it: a container's terminal
//! is one on each side, the runtime's on the host and the agent's in the
//! guest.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

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

/// `size` as the kernel takes it.
pub fn window(size: WindowSize) -> libc::winsize {
    libc::winsize {
        ws_row: size.rows,
        ws_col: size.columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Makes `command` start in a session of its own whose controlling terminal
/// is its standard input, a terminal's slave: that terminal's signals
/// (SIGWINCH at a new size, SIGHUP at its hangup, SIGINT at its Ctrl-C
/// where the line discipline makes them) then go to it.
pub fn make_controlling(command: &mut Command) {
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
}
