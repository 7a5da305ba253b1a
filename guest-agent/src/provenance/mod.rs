//! Provenance capture: which processes the job's command started and which
//! files each read and wrote, as [`ProvRecord`]s for the host.
//!
//! The mechanism is ptrace with a seccomp filter (see [`seccomp`]): the
//! command stops only at the few calls that name files, and at fork, exec
//! and exit. It is exact where asynchronous mechanisms (fanotify, the proc
//! connector) are not: the tracer sees each process while it is stopped,
//! so a program that lives for a millisecond still has its argv and
//! environment recorded, and every file access is credited to the process
//! that made it. The agent itself is never traced.

mod files;
mod ptrace;
mod recorder;
mod seccomp;
mod stack;
mod syscall;
mod tracer;

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{ChildStderr, ChildStdout, Command};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use provm_guest_agent::{Outcome, ProvRecord};

/// A command running under the tracer; its outputs are the caller's to
/// forward, and `finish` waits for it.
pub struct Traced {
    /// The command's process id.
    pub pid: u32,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    tracer: JoinHandle<io::Result<(Outcome, Vec<ProvRecord>)>>,
}

impl Traced {
    /// Waits until the command exited (and what it left running was ended).
    pub fn finish(self) -> io::Result<(Outcome, Vec<ProvRecord>)> {
        self.tracer
            .join()
            .map_err(|_| io::Error::other("the tracer thread panicked"))?
    }
}

/// Spawns `command` traced from its exec on. The tracer is a thread of its
/// own, because ptrace answers only the thread that forked the tracee, and
/// it can then wait for its tracees while the caller forwards the output.
pub fn spawn(mut command: Command) -> io::Result<Traced> {
    let filter = seccomp::filter();
    // SAFETY: between fork and exec the closure only makes system calls.
    unsafe {
        command.pre_exec(move || {
            ptrace::trace_me()?;
            seccomp::install(&filter)
        });
    }
    let (spawned, outputs) = mpsc::channel();
    let tracer = thread::spawn(move || {
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                let _ = spawned.send(Err(error));
                return Err(io::Error::other("the command did not start"));
            }
        };
        let _ = spawned.send(Ok((child.id(), child.stdout.take(), child.stderr.take())));
        tracer::Tracer::new(child.id() as ptrace::Pid).run()
    });
    let (pid, stdout, stderr) = outputs
        .recv()
        .map_err(|_| io::Error::other("the tracer thread ended before spawning"))??;
    Ok(Traced {
        pid,
        stdout,
        stderr,
        tracer,
    })
}
