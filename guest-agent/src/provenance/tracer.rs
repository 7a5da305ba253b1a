//! The tracer: a thread of the agent that spawns the job's command under
//! ptrace and follows it and every process it starts until it exits.
//!
//! Only what the seccomp filter marks stops the tracees, besides fork,
//! exec and exit. When the command exits, processes it left running are
//! killed: one that outlived the tracer would keep the filter, and every
//! traced call of it would fail.

use std::collections::{HashMap, HashSet};
use std::io;

use provm_guest_agent::{Outcome, ProvRecord};

use super::ptrace::{self, Pid};
use super::recorder::{Image, Recorder};
use super::stack;
use super::syscall::{self, Call};

pub struct Tracer {
    root: Pid,
    /// Each live task (thread) and its thread group (process).
    tasks: HashMap<Pid, Pid>,
    /// New tasks whose first stop came before their parent's fork event.
    early: HashSet<Pid>,
    /// New tasks whose first stop (an automatic SIGSTOP) is still to come.
    awaited: HashSet<Pid>,
    /// Calls whose effect is recorded at their syscall-exit stop.
    pending: HashMap<Pid, Call>,
    outcome: Option<Outcome>,
    recorder: Recorder,
}

impl Tracer {
    pub fn new(root: Pid) -> Self {
        Tracer {
            root,
            tasks: HashMap::new(),
            early: HashSet::new(),
            awaited: HashSet::new(),
            pending: HashMap::new(),
            outcome: None,
            recorder: Recorder::default(),
        }
    }

    /// Follows the command until it exits, then ends what it left running;
    /// returns its outcome and the records.
    pub fn run(mut self) -> io::Result<(Outcome, Vec<ProvRecord>)> {
        while self.outcome.is_none() {
            let Some((pid, status)) = ptrace::wait_any()? else {
                break;
            };
            self.handle(pid, status)?;
        }
        for &task in self.tasks.keys() {
            // SAFETY: kill(2) takes no pointers; every `task` is a tracee of
            // this thread, not yet reaped (it is still in `tasks`), so the pid is not
            // some other process's.
            unsafe { libc::kill(task, libc::SIGKILL) };
        }
        while !self.tasks.is_empty() {
            let Some((pid, status)) = ptrace::wait_any()? else {
                break;
            };
            self.handle(pid, status)?;
        }
        let outcome = self
            .outcome
            .ok_or_else(|| io::Error::other("the command vanished without an exit status"))?;
        Ok((outcome, self.recorder.finish()))
    }

    fn handle(&mut self, pid: Pid, status: libc::c_int) -> io::Result<()> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            self.exited(pid, status);
            return Ok(());
        }
        if !libc::WIFSTOPPED(status) {
            return Ok(());
        }
        let signal = libc::WSTOPSIG(status);
        let event = status >> 16;
        let result = match (signal, event) {
            (libc::SIGTRAP, 0) if pid == self.root && self.tasks.is_empty() => self.started(pid),
            (libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP) => return self.syscall_entry(pid),
            (libc::SIGTRAP, libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK) => {
                self.new_task(pid, false)
            }
            (libc::SIGTRAP, libc::PTRACE_EVENT_CLONE) => {
                let thread = is_thread(pid)?;
                self.new_task(pid, thread)
            }
            (libc::SIGTRAP, libc::PTRACE_EVENT_EXEC) => {
                self.exec(pid);
                Ok(())
            }
            (signal, 0) if signal == libc::SIGTRAP | 0x80 => {
                self.syscall_exit(pid);
                Ok(())
            }
            (libc::SIGSTOP, 0) if self.awaited.remove(&pid) => Ok(()),
            (libc::SIGSTOP, 0) if !self.tasks.contains_key(&pid) => {
                // Resumed when its parent's fork event says whose it is.
                self.early.insert(pid);
                return Ok(());
            }
            (libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU, 0)
                if ptrace::is_group_stop(pid) =>
            {
                Ok(())
            }
            (signal, 0) => return resume(ptrace::resume(pid, signal)),
            _ => Ok(()),
        };
        result?;
        resume(ptrace::resume(pid, 0))
    }

    /// The command's first stop, right after its exec.
    fn started(&mut self, pid: Pid) -> io::Result<()> {
        ptrace::set_options(pid)?;
        self.tasks.insert(pid, pid);
        let cwd = ptrace::proc_link(pid, "cwd")?;
        self.recorder.start(pid, cwd, image(pid)?);
        Ok(())
    }

    fn new_task(&mut self, parent: Pid, thread: bool) -> io::Result<()> {
        let child = ptrace::event_message(parent)? as Pid;
        let group = self.tasks.get(&parent).copied().unwrap_or(parent);
        if thread {
            self.tasks.insert(child, group);
        } else {
            if self.recorder.holds_written(group) {
                // Unlisted, the parent keeps what it holds.
                let may_map = self.recorder.may_map_writable(group);
                if let Ok(open) = ptrace::writable_files(parent, may_map) {
                    self.recorder.release_closed(group, &open);
                }
            }
            self.tasks.insert(child, child);
            self.recorder.fork(group, child);
        }
        if self.early.remove(&child) {
            resume(ptrace::resume(child, 0))?;
        } else {
            self.awaited.insert(child);
        }
        Ok(())
    }

    fn exec(&mut self, pid: Pid) {
        let Ok(image) = image(pid) else {
            return;
        };
        let open = self
            .recorder
            .holds_files(pid)
            .then(|| ptrace::open_files(pid).unwrap_or_default());
        self.recorder.exec(pid, image, open);
    }

    fn syscall_entry(&mut self, pid: Pid) -> io::Result<()> {
        let group = self.tasks.get(&pid).copied().unwrap_or(pid);
        if self.recorder.needs_name(group) {
            if let Ok(comm) = ptrace::comm(pid) {
                self.recorder.name(group, &comm);
            }
        }
        let regs = ptrace::registers(pid)?;
        // A path the tracee cannot name (a bad pointer) fails its call too.
        let Ok(Some(call)) = syscall::decode(pid, &regs, self.recorder.cwd(group)) else {
            return resume(ptrace::resume(pid, 0));
        };
        match &call {
            Call::Open { path, flags } => self.recorder.open(group, path, *flags),
            Call::Truncate { path } => self.recorder.truncate(group, path),
            Call::Rename { from, to } | Call::Link { from, to } => {
                self.recorder.touch(from);
                self.recorder.touch(to);
            }
            Call::Unlink { path } => self.recorder.touch(path),
            Call::Chdir => {}
        }
        if call.needs_result() {
            self.pending.insert(pid, call);
            return resume(ptrace::resume_to_syscall_exit(pid));
        }
        resume(ptrace::resume(pid, 0))
    }

    fn syscall_exit(&mut self, pid: Pid) {
        let Some(call) = self.pending.remove(&pid) else {
            return;
        };
        let group = self.tasks.get(&pid).copied().unwrap_or(pid);
        let succeeded = ptrace::registers(pid).is_ok_and(|regs| regs.rax == 0);
        if !succeeded {
            return;
        }
        match call {
            Call::Rename { from, to } => self.recorder.renamed(group, &from, &to),
            Call::Link { from, to } => self.recorder.linked(group, &from, &to),
            Call::Unlink { path } => self.recorder.unlinked(group, &path),
            Call::Chdir => {
                if let Ok(cwd) = ptrace::proc_link(pid, "cwd") {
                    self.recorder.chdir(group, cwd);
                }
            }
            Call::Open { .. } | Call::Truncate { .. } => {}
        }
    }

    fn exited(&mut self, pid: Pid, status: libc::c_int) {
        self.pending.remove(&pid);
        let Some(group) = self.tasks.remove(&pid) else {
            return;
        };
        if group != pid {
            return;
        }
        let outcome = outcome(status);
        self.recorder.exit(pid, outcome);
        if pid == self.root {
            self.outcome = Some(outcome);
        }
    }
}

/// A tracee that vanished (killed while stopped) cannot be resumed: that is
/// no error of the tracer's.
fn resume(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        other => other,
    }
}

/// What `pid`, stopped right after its exec, runs.
fn image(pid: Pid) -> io::Result<Image> {
    let exe = ptrace::proc_link(pid, "exe")?;
    let (argv, env) = match stack::exec_lists(pid, ptrace::registers(pid)?.rsp) {
        Ok(lists) => lists,
        Err(_) => (
            ptrace::proc_list(pid, "cmdline")?,
            ptrace::proc_list(pid, "environ")?,
        ),
    };
    Ok(Image { exe, argv, env })
}

/// Whether the clone a task stopped in makes a thread (not a process).
fn is_thread(pid: Pid) -> io::Result<bool> {
    let regs = ptrace::registers(pid)?;
    let flags = match regs.orig_rax as libc::c_long {
        libc::SYS_clone => regs.rdi,
        // struct clone_args starts with the u64 flags.
        libc::SYS_clone3 => ptrace::read_u64(pid, regs.rdi)?,
        _ => 0,
    };
    Ok(flags & libc::CLONE_THREAD as u64 != 0)
}

/// The outcome of an ended task's wait status.
fn outcome(status: libc::c_int) -> Outcome {
    if libc::WIFSIGNALED(status) {
        Outcome::Signaled(libc::WTERMSIG(status))
    } else {
        Outcome::Exited(libc::WEXITSTATUS(status))
    }
}
