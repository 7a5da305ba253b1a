//! What the host asks of a recording from outside its thread, from a
//! signal handler or the thread reading its standard input (so only
//! atomics): that it end at the guest's next exit (Ctrl-C), that a signal
//! go to the guest's command there (a container runtime's `kill`), that its
//! terminal take a new size (SIGWINCH), or that standard input that came go
//! to it. The recorder stops the guest while any is due: to end, at once
//! (`Recorder::stop_reason`); for a signal, a size or input, right after
//! its next exit, never at a kick, which a replay does not meet again
//! (`Recorder::host_input_due`). The session then sends it to the agent,
//! which the log keeps as the host's input there, so that a replay sends
//! it after the same exit.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// Set in `HostRequests::resize` while a size is due.
const RESIZE_DUE: u64 = 1 << 32;

pub struct HostRequests {
    end: AtomicBool,
    /// The signal for the command, 0: none.
    signal: AtomicI32,
    /// The command's terminal's new size, `RESIZE_DUE | rows << 16 |
    /// columns`; 0: none due.
    resize: AtomicU64,
    /// Standard input has come (or ended) for the command.
    stdin: AtomicBool,
}

/// The requests of a recorder nothing asks anything of (a pinned run's, a
/// fork's): there Ctrl-C ends provm at once.
pub static NO_HOST_REQUESTS: HostRequests = HostRequests::new();

impl HostRequests {
    pub const fn new() -> Self {
        HostRequests {
            end: AtomicBool::new(false),
            signal: AtomicI32::new(0),
            resize: AtomicU64::new(0),
            stdin: AtomicBool::new(false),
        }
    }

    /// Ends the recording at the guest's next exit. Async-signal-safe.
    pub fn end(&self) {
        self.end.store(true, Ordering::Relaxed);
    }

    pub fn ended(&self) -> bool {
        self.end.load(Ordering::Relaxed)
    }

    /// Sends `signal` to the guest's command at the guest's next exit; a
    /// signal not yet sent is replaced. Async-signal-safe.
    pub fn signal_command(&self, signal: i32) {
        self.signal.store(signal, Ordering::Relaxed);
    }

    pub fn signal_due(&self) -> bool {
        self.signal.load(Ordering::Relaxed) != 0
    }

    /// The command's terminal takes the size `rows` by `columns` at the
    /// guest's next exit; a size not yet sent is replaced.
    /// Async-signal-safe.
    pub fn resize_terminal(&self, rows: u16, columns: u16) {
        let size = u64::from(rows) << 16 | u64::from(columns);
        self.resize.store(RESIZE_DUE | size, Ordering::Relaxed);
    }

    /// The terminal's size to send the command now (rows, columns), if one
    /// is due.
    pub fn take_resize(&self) -> Option<(u16, u16)> {
        let resize = self.resize.swap(0, Ordering::Relaxed);
        (resize & RESIZE_DUE != 0).then_some(((resize >> 16) as u16, resize as u16))
    }

    /// Standard input has come for the command, or ended: the session
    /// takes it at the guest's next exit.
    pub fn stdin_came(&self) {
        self.stdin.store(true, Ordering::Relaxed);
    }

    /// Whether standard input came since the last call.
    pub fn take_stdin(&self) -> bool {
        self.stdin.swap(false, Ordering::Relaxed)
    }

    /// Whether the guest should stop after its next exit for the host's
    /// input: a signal, a terminal's size, or standard input.
    pub fn input_due(&self) -> bool {
        self.signal_due()
            || self.resize.load(Ordering::Relaxed) != 0
            || self.stdin.load(Ordering::Relaxed)
    }

    /// The signal to send to the command now, if one is due.
    pub fn take_signal(&self) -> Option<i32> {
        match self.signal.swap(0, Ordering::Relaxed) {
            0 => None,
            signal => Some(signal),
        }
    }
}

impl Default for HostRequests {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_is_taken_once_and_ending_stays() {
        let requests = HostRequests::new();
        assert!(!requests.signal_due() && !requests.ended());
        requests.signal_command(15);
        assert!(requests.signal_due());
        assert_eq!(requests.take_signal(), Some(15));
        assert_eq!(requests.take_signal(), None);
        requests.stdin_came();
        assert!(requests.input_due() && !requests.signal_due());
        assert!(requests.take_stdin() && !requests.take_stdin());
        assert!(!requests.input_due());
        // The last size asked for, once; 0 by 0 is a size too.
        requests.resize_terminal(24, 80);
        requests.resize_terminal(0, 0);
        assert!(requests.input_due() && !requests.signal_due());
        assert_eq!(requests.take_resize(), Some((0, 0)));
        assert_eq!(requests.take_resize(), None);
        requests.resize_terminal(u16::MAX, 1);
        assert_eq!(requests.take_resize(), Some((u16::MAX, 1)));
        assert!(!requests.input_due());
        requests.end();
        assert!(requests.ended());
        // Ending stays: the recorder is asked at every exit until it stops.
        assert!(requests.ended(), "asked again");
    }
}
