//! What signal handlers ask of the guest under way, run or recorded:
//! Ctrl-C that a recording end cleanly, provm-runtime's `kill` that the
//! command get a signal, and SIGWINCH that its terminal take a new size.
//! One set per process, which runs one guest at a time.

use provm_seams::HostRequests;

pub(crate) static REQUESTS: HostRequests = HostRequests::new();

/// Ends the recording under way as Ctrl-C does: the guest stops at its
/// next exit and the trace is finished, marked cut short. One atomic
/// store, so a signal handler may call it.
pub fn end_recording() {
    REQUESTS.end();
}

/// Sends `signal` to the command in the guest at the guest's next exit
/// (a recording keeps it there, for its replay). One atomic store, so a
/// signal handler may call it (provm-runtime's, for the signals `kill`
/// sends a container).
pub fn signal_command(signal: libc::c_int) {
    REQUESTS.signal_command(signal);
}

/// Gives the command's terminal in the guest the size `rows` by `columns`
/// at the guest's next exit (a recording keeps it there, for its replay).
/// One atomic store, so a signal handler may call it (SIGWINCH's).
pub fn resize_terminal(rows: u16, columns: u16) {
    REQUESTS.resize_terminal(rows, columns);
}
