//! Turns what the tracer sees (forks, execs, file calls, exits) into the
//! job's provenance records.
//!
//! A *process* in the records is one program a process ran: a fork starts
//! one that runs its parent's program (a subshell) until its first exec
//! names it; every later exec of the same process starts another, started
//! by the one before (`exec: true`). What a forked child did before its
//! first exec (a shell's redirections) is the program's own doing.

use std::collections::HashMap;

use provm_guest_agent::records::{assemble, Relations};
use provm_guest_agent::{Outcome, Process, ProvRecord};

use super::files::{Files, Holder};
use super::ptrace::{now_ns, Pid};

/// What exec put in a process.
pub struct Image {
    pub exe: Vec<u8>,
    pub argv: Vec<Vec<u8>>,
    pub env: Vec<Vec<u8>>,
}

/// A live traced process (by thread group id).
struct Live {
    /// Index in `Recorder::processes` of the program it runs.
    process: u32,
    cwd: Vec<u8>,
    /// Paths it opened for reading, or inherited so: an exec'd program
    /// still holding one reads it (`sort < in.txt`).
    reads: Vec<Vec<u8>>,
    /// Whether it, or a parent before its fork, opened a file for reading
    /// and writing: only such a descriptor can be mapped shared and
    /// writable, and the mapping outlive the descriptor.
    read_write: bool,
    /// Whether it exec'd since its fork.
    execed: bool,
    /// Whether its program's name is known: it exec'd, or its name was
    /// checked (see [`Recorder::needs_name`]).
    named: bool,
}

#[derive(Default)]
pub struct Recorder {
    files: Files,
    environments: HashMap<Vec<Vec<u8>>, u32>,
    processes: Vec<Process>,
    relations: Relations,
    live: HashMap<Pid, Live>,
}

impl Recorder {
    /// The job's command, stopped after its exec; `cwd` is where it runs.
    pub fn start(&mut self, tgid: Pid, cwd: Vec<u8>, image: Image) {
        let process = self.new_process(tgid, 0);
        self.live.insert(
            tgid,
            Live {
                process,
                cwd,
                reads: Vec::new(),
                read_write: false,
                execed: false,
                named: false,
            },
        );
        self.exec(tgid, image, None);
    }

    pub fn fork(&mut self, parent: Pid, child: Pid) {
        let Some(live) = self.live.get(&parent) else {
            return;
        };
        let (starter, cwd, reads, read_write) = (
            live.process,
            live.cwd.clone(),
            live.reads.clone(),
            live.read_write,
        );
        let parent_record = &self.processes[starter as usize];
        let (exe, argv, env) = (
            parent_record.exe.clone(),
            parent_record.argv.clone(),
            parent_record.env,
        );
        let id = self.new_process(child, env);
        let record = &mut self.processes[id as usize];
        (record.exe, record.argv) = (exe, argv);
        self.relations.started(id, starter, false);
        self.files.inherit(
            parent,
            Holder {
                tgid: child,
                process: id,
            },
        );
        self.live.insert(
            child,
            Live {
                process: id,
                cwd,
                reads,
                read_write,
                execed: false,
                named: false,
            },
        );
    }

    /// Whether the process may hold files the records care about, so that
    /// the tracer lists its open files for [`Recorder::exec`].
    pub fn holds_files(&self, tgid: Pid) -> bool {
        self.live
            .get(&tgid)
            .is_some_and(|live| !live.reads.is_empty())
            || self.holds_written(tgid)
    }

    /// Whether `tgid` holds files for writing (see [`Recorder::release_closed`]).
    pub fn holds_written(&self, tgid: Pid) -> bool {
        !self.files.held_by(tgid).is_empty()
    }

    /// Whether `tgid` may map a file shared and writable.
    pub fn may_map_writable(&self, tgid: Pid) -> bool {
        self.live.get(&tgid).is_some_and(|live| live.read_write)
    }

    /// `tgid` lets go of the files it held for writing that are not in
    /// `open` (it can no longer write them): each is observed, what
    /// changed credited to it. Called at exec, and before a fork, so that
    /// a shell's children do not inherit the files it redirected to and
    /// closed long ago, each of which every exit would read again.
    pub fn release_closed(&mut self, tgid: Pid, open: &[Vec<u8>]) {
        for path in self.files.held_by(tgid) {
            if !open.contains(&path) {
                let (_, change) = self.files.observe(&path, Some(tgid));
                self.relations.changed(change);
                self.files.remove_holder(&path, tgid);
            }
        }
    }

    /// `tgid` exec'd `image`; `open` is what it holds open after the exec
    /// (`None` when [`Recorder::holds_files`] said there was no need).
    pub fn exec(&mut self, tgid: Pid, image: Image, open: Option<Vec<Vec<u8>>>) {
        let Some(live) = self.live.get(&tgid) else {
            return;
        };
        let (old, execed) = (live.process, live.execed);
        let open = open.unwrap_or_default();
        // What went to files the exec closed is the old program's; a file
        // still open goes on being written by the new one (`exec cmd > f`).
        self.release_closed(tgid, &open);
        let process = if execed {
            self.processes[old as usize].end_ns = now_ns();
            let new = self.new_process(tgid, 0);
            self.relations.started(new, old, true);
            self.files.rename_holder(tgid, new);
            new
        } else {
            old
        };
        let env = self.environment(image.env);
        let record = &mut self.processes[process as usize];
        (record.exe, record.argv, record.env) = (image.exe.clone(), image.argv, env);
        let live = self.live.get_mut(&tgid).unwrap();
        (live.process, live.execed, live.named) = (process, true, true);
        live.reads.retain(|path| open.contains(path));
        for path in live.reads.clone() {
            self.read(process, &path);
        }
        let (exe, change) = self.files.observe(&image.exe, None);
        self.relations.changed(change);
        if let Some(exe) = exe {
            self.use_file(process, exe, true);
        }
    }

    /// Whether `tgid` is a fork that did not exec and whose name was not
    /// checked. Multi-call binaries run some programs that way (busybox's
    /// shell runs `sort` in a fork, renamed but not exec'd): the tracer
    /// then reads the process's name for [`Recorder::name`].
    pub fn needs_name(&self, tgid: Pid) -> bool {
        self.live.get(&tgid).is_some_and(|live| !live.named)
    }

    /// `tgid`'s name (/proc/PID/comm) at its first traced call since its
    /// fork: a name other than its program's makes it that program.
    pub fn name(&mut self, tgid: Pid, comm: &[u8]) {
        let Some(live) = self.live.get_mut(&tgid) else {
            return;
        };
        live.named = true;
        let record = &mut self.processes[live.process as usize];
        if record.renamed_to(comm) {
            record.argv = vec![comm.to_vec()];
        }
    }

    /// `tgid` opens `path` with open(2) `flags`.
    pub fn open(&mut self, tgid: Pid, path: &[u8], flags: i32) {
        let Some(live) = self.live.get_mut(&tgid) else {
            return;
        };
        let process = live.process;
        let access = flags & libc::O_ACCMODE;
        live.read_write |= access == libc::O_RDWR;
        if access != libc::O_WRONLY && !live.reads.iter().any(|read| read == path) {
            live.reads.push(path.to_vec());
        }
        if access == libc::O_WRONLY {
            self.touch(path);
        } else {
            self.read(process, path);
        }
        if access != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.files.add_holder(path, Holder { tgid, process });
        }
    }

    /// `tgid` truncates `path` by name: a write.
    pub fn truncate(&mut self, tgid: Pid, path: &[u8]) {
        self.touch(path);
        if let Some(live) = self.live.get(&tgid) {
            let holder = Holder {
                tgid,
                process: live.process,
            };
            self.files.add_holder(path, holder);
        }
    }

    /// Before a call that changes `path`'s name: its content as it is.
    pub fn touch(&mut self, path: &[u8]) {
        let (_, change) = self.files.observe(path, None);
        self.relations.changed(change);
    }

    pub fn renamed(&mut self, tgid: Pid, from: &[u8], to: &[u8]) {
        if let Some((version, source)) = self.files.renamed(from, to) {
            self.derived(tgid, version, source);
            self.invalidated(tgid, source);
        }
    }

    pub fn linked(&mut self, tgid: Pid, from: &[u8], to: &[u8]) {
        if let Some((version, source)) = self.files.linked(from, to) {
            self.derived(tgid, version, source);
        }
    }

    pub fn unlinked(&mut self, tgid: Pid, path: &[u8]) {
        if let Some(version) = self.files.unlinked(path) {
            self.invalidated(tgid, version);
        }
    }

    pub fn cwd(&self, tgid: Pid) -> &[u8] {
        self.live.get(&tgid).map_or(b"/", |live| &live.cwd)
    }

    pub fn chdir(&mut self, tgid: Pid, cwd: Vec<u8>) {
        if let Some(live) = self.live.get_mut(&tgid) {
            live.cwd = cwd;
        }
    }

    pub fn exit(&mut self, tgid: Pid, outcome: Outcome) {
        self.observe_held(tgid);
        for path in self.files.held_by(tgid) {
            self.files.remove_holder(&path, tgid);
        }
        if let Some(live) = self.live.remove(&tgid) {
            let process = &mut self.processes[live.process as usize];
            process.end_ns = now_ns();
            process.outcome = Some(outcome);
        }
    }

    /// The records, each after those it refers to.
    pub fn finish(mut self) -> Vec<ProvRecord> {
        for path in self.files.held_paths() {
            self.touch(&path);
        }
        assemble(
            self.environments,
            self.files.into_versions(),
            self.processes,
            self.relations,
        )
    }

    /// Observes what `tgid` holds for writing, crediting it with changes.
    fn observe_held(&mut self, tgid: Pid) {
        for path in self.files.held_by(tgid) {
            let (_, change) = self.files.observe(&path, Some(tgid));
            self.relations.changed(change);
        }
    }

    fn read(&mut self, process: u32, path: &[u8]) {
        let (version, change) = self.files.observe(path, None);
        self.relations.changed(change);
        if let Some(version) = version {
            self.use_file(process, version, false);
        }
    }

    fn use_file(&mut self, process: u32, file: u32, execute: bool) {
        self.relations.used(process, file, execute);
    }

    fn derived(&mut self, tgid: Pid, file: u32, from: u32) {
        if let Some(live) = self.live.get(&tgid) {
            self.relations.derived(file, from, live.process);
        }
    }

    fn invalidated(&mut self, tgid: Pid, file: u32) {
        if let Some(live) = self.live.get(&tgid) {
            self.relations.invalidated(file, live.process);
        }
    }

    fn new_process(&mut self, pid: Pid, env: u32) -> u32 {
        let id = self.processes.len() as u32;
        self.processes.push(Process {
            id,
            pid: pid as u32,
            env,
            start_ns: now_ns(),
            ..Process::default()
        });
        id
    }

    fn environment(&mut self, entries: Vec<Vec<u8>>) -> u32 {
        let next = self.environments.len() as u32;
        *self.environments.entry(entries).or_insert(next)
    }
}
