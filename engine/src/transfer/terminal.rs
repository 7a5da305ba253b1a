//! The host's terminal a command runs on (`provm run --tty`, a container's
//! `process.terminal`): only a conduit to the command's own terminal in
//! the guest (the agent's), so it is made raw, what is typed passing on
//! unchanged for the guest's terminal to echo and edit, and the guest's
//! output, its lines ended there, coming out as it is; the guest's
//! terminal takes its size at the start and at each change (SIGWINCH).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use provm_guest_agent::{pty, WindowSize};

/// Makes the terminal `fd` is raw; returns its settings before. With
/// `keep_output`, its output processing stays as it was (a user's
/// terminal: provm's own lines keep their line ends; the guest's, ended
/// CR LF already, look the same).
pub fn make_raw(fd: BorrowedFd<'_>, keep_output: bool) -> io::Result<libc::termios> {
    // SAFETY: tcgetattr, cfmakeraw and tcsetattr read and write only the
    // termios structures on this stack, for the open descriptor `fd`.
    unsafe {
        let mut before: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd.as_raw_fd(), &mut before) < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = before;
        libc::cfmakeraw(&mut raw);
        if keep_output {
            raw.c_oflag = before.c_oflag;
        }
        if libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &raw) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(before)
    }
}

/// provm's standard input, a terminal, raw for what is typed until this
/// is dropped (the user's terminal is theirs again when provm ends,
/// however it ends short of a signal that kills it).
pub struct RawStdin {
    before: libc::termios,
}

impl RawStdin {
    /// Makes standard input raw, and the command's terminal follow its
    /// size; returns its size now too.
    pub fn enter() -> io::Result<(RawStdin, WindowSize)> {
        let stdin = io::stdin();
        let size = pty::size(stdin.as_fd())?;
        let before = make_raw(stdin.as_fd(), true)?;
        forward_resizes()?;
        Ok((RawStdin { before }, size))
    }
}

impl Drop for RawStdin {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the termios this holds, for descriptor 0.
        unsafe { libc::tcsetattr(io::stdin().as_raw_fd(), libc::TCSANOW, &self.before) };
    }
}

/// From now on, each new size of the terminal on standard input goes to
/// the command's terminal at the guest's next exit (see
/// `crate::requests::resize_terminal`). The terminal signals it to the
/// process whose controlling terminal it is.
pub fn forward_resizes() -> io::Result<()> {
    // SAFETY: the handler is an extern "C" fn that only makes an ioctl and
    // an atomic store; the sigaction structure is plain data on this stack.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = resized as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        if libc::sigaction(libc::SIGWINCH, &action, std::ptr::null_mut()) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn resized(_: libc::c_int) {
    // SAFETY: descriptor 0 stays open for the process's life; borrowing it
    // raw, not through io::stdin(), keeps the handler free of locks.
    let stdin = unsafe { BorrowedFd::borrow_raw(libc::STDIN_FILENO) };
    if let Ok(size) = pty::size(stdin) {
        crate::requests::resize_terminal(size.rows, size.columns);
    }
}
