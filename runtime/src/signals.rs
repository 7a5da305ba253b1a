//! Signals: their names as `kill` takes them, and the container process's
//! handler, which passes them on to the command in the guest, where the
//! recording keeps them for its replay.

use std::sync::atomic::{AtomicI32, Ordering};

use libc::c_int;

/// The container's process that `run` waits for; 0: none yet.
static WAITED_FOR: AtomicI32 = AtomicI32::new(0);

/// What `kill` sends and `podman stop` sends first, passed on to the
/// command. SIGKILL cannot be caught: it ends the VM, and the trace is
/// what a killed recording leaves (`delete`).
const FORWARDED: &[c_int] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

const NAMES: &[(&str, c_int)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("IOT", libc::SIGIOT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("STKFLT", libc::SIGSTKFLT),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// A signal as runc's `kill` takes it: `SIGTERM`, `TERM` or `15`.
pub fn parse(text: &str) -> Result<c_int, String> {
    if let Ok(number) = text.parse::<c_int>() {
        if (1..=libc::SIGRTMAX()).contains(&number) {
            return Ok(number);
        }
    }
    let name = text.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    NAMES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, number)| *number)
        .ok_or_else(|| format!("{text:?} is not a signal: give a name (SIGTERM, TERM) or a number"))
}

extern "C" fn into_the_guest(signal: c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    provm_engine::requests::signal_command(signal);
}

/// From now on, the signals `kill` sends go to the command in the guest,
/// at the guest's next exit, instead of ending this process; a recording
/// keeps them there, and its replay sends them at the same place.
pub fn forward_into_the_guest() -> Result<(), String> {
    on_forwarded_signals(into_the_guest)
}

/// `handler` for each of the signals passed on to the command.
fn on_forwarded_signals(handler: vmm_sys_util::signal::SignalHandler) -> Result<(), String> {
    for &signal in FORWARDED {
        vmm_sys_util::signal::register_signal_handler(signal, handler)
            .map_err(|error| format!("cannot handle signal {signal}: {error}"))?;
    }
    Ok(())
}

extern "C" fn forward(signal: c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let pid = WAITED_FOR.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe and touches no memory of ours.
        unsafe { libc::kill(pid, signal) };
    }
}

/// From now on, the signals `kill` sends to `run` go on to the
/// container's process `pid`, as they would to runc's, and from there to
/// the command: a workload manager that signals `run` (Slurm's) signals
/// the command.
pub fn forward_to(pid: i32) -> Result<(), String> {
    WAITED_FOR.store(pid, Ordering::Relaxed);
    on_forwarded_signals(forward)
}

/// Sends `signal` to `pid`.
pub fn send(pid: i32, signal: c_int) -> Result<(), String> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    match unsafe { libc::kill(pid, signal) } {
        0 => Ok(()),
        _ => Err(format!(
            "cannot send signal {signal} to the container's process {pid}: {}",
            std::io::Error::last_os_error()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_read_as_runc_reads_them() {
        assert_eq!(parse("SIGTERM"), Ok(libc::SIGTERM));
        assert_eq!(parse("TERM"), Ok(libc::SIGTERM));
        assert_eq!(parse("kill"), Ok(libc::SIGKILL));
        assert_eq!(parse("15"), Ok(15));
        assert!(parse("0").is_err());
        assert!(parse("SIGNOPE").unwrap_err().contains("SIGNOPE"));
    }
}
