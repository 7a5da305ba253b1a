//! `--analyze provenance`, and `provm graph` on a trace recorded without
//! `--prov`: the run's provenance derived at replay from the system calls,
//! as the records the agent's in-guest tracer makes (guest-agent's
//! provenance::recorder), so that one model (guest-agent's `records`) and
//! one set of exports serve both, and recording costs nothing extra for
//! provenance.
//!
//! The job is every process the agent (the guest's PID 1) forked, from its
//! exec on, and their descendants. A *process* in the records is one
//! program a process ran: a fork runs its parent's program until its first
//! exec names it; each later exec starts another (`exec: true`). A fork
//! that never exec'd and renamed itself is that program (busybox's shell
//! runs applets so).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};

use provm_guest_agent::records::{assemble, Relations};
use provm_guest_agent::{Outcome, Process, ProvRecord};
use provm_seams::Position;
use serde_json::json;
use syscalls::x86_64::Sysno;

use super::versions::{
    is_kernel_file, Copy, Files, Transfer, O_ACCMODE, O_CREAT_WRONLY_TRUNC, O_DIRECTORY, O_PATH,
    O_RDONLY, O_TRUNC, O_WRONLY,
};
use provm_analysis::api::{Analysis, ProcessEvent};
use provm_analysis::syscall::{Arg, Syscall};

/// The guest agent's pid: what it forks is the job.
const AGENT_PID: i32 = 1;
const RENAME_EXCHANGE: u64 = 2;
const AT_REMOVEDIR: u64 = 0x200;
const MAP_SHARED: u64 = 1;
const PROT_WRITE: u64 = 2;

/// A live process of the job (by thread group id).
#[derive(Clone)]
struct Live {
    /// Index in `processes` of the program it runs.
    process: u32,
    /// Whether it exec'd since its fork.
    execed: bool,
    /// Its name at its latest system call.
    comm: String,
}

#[derive(Clone, Default)]
pub struct DerivedProvenance {
    live: HashMap<i32, Live>,
    /// Forked by the agent and not yet exec'd: the job's command starting.
    starting: HashSet<i32>,
    /// The environment each thread group's execve passed, until it returns.
    exec_env: HashMap<i32, Vec<String>>,
    files: Files,
    /// Paths each process read through a descriptor, to use them once.
    read_paths: HashSet<(u32, String)>,
    environments: BTreeMap<Vec<Vec<u8>>, u32>,
    processes: Vec<Process>,
    relations: Relations,
    /// Guest time at the first process event (the agent forking the job),
    /// which the records' times count from.
    first_ns: Option<u64>,
}

impl DerivedProvenance {
    /// The records so far (each after those it refers to), with what is
    /// still being written made into versions, and the times placed on
    /// the wall clock with the first process event at `start_unix_ns`.
    pub fn records(&self, start_unix_ns: u64) -> Vec<ProvRecord> {
        let mut done = self.clone();
        for path in done.files.written(|_| true) {
            done.observe(&path);
        }
        let live: Vec<Live> = done.live.values().cloned().collect();
        for live in live {
            done.name_if_renamed(&live);
        }
        let first_ns = done.first_ns.unwrap_or_default();
        for process in &mut done.processes {
            process.start_ns = (process.start_ns + start_unix_ns).saturating_sub(first_ns);
            if process.end_ns != 0 {
                process.end_ns = (process.end_ns + start_unix_ns).saturating_sub(first_ns);
            }
        }
        assemble(
            done.environments,
            done.files.into_versions(),
            done.processes,
            done.relations,
        )
    }

    fn fork(&mut self, parent: i32, child: i32, at: Position) {
        if parent == AGENT_PID {
            self.starting.insert(child);
            return;
        }
        let Some(live) = self.live.get(&parent).cloned() else {
            return;
        };
        let starter = &self.processes[live.process as usize];
        let (exe, argv, env) = (starter.exe.clone(), starter.argv.clone(), starter.env);
        let id = self.new_process(child, env, at);
        let record = &mut self.processes[id as usize];
        (record.exe, record.argv) = (exe, argv);
        self.relations.started(id, live.process, false);
        let live = Live {
            process: id,
            execed: false,
            comm: live.comm,
        };
        self.live.insert(child, live);
    }

    fn exec(&mut self, pid: i32, exe: &str, argv: &[String], at: Position) {
        let env = self.exec_env.remove(&pid).unwrap_or_default();
        let env = self.environment(env);
        if self.starting.remove(&pid) {
            let process = self.new_process(pid, env, at);
            let live = Live {
                process,
                execed: false,
                comm: String::new(),
            };
            self.live.insert(pid, live);
        }
        let Some(live) = self.live.get(&pid).cloned() else {
            return;
        };
        let process = if live.execed {
            self.processes[live.process as usize].end_ns = at.guest_ns;
            let new = self.new_process(pid, env, at);
            self.relations.started(new, live.process, true);
            new
        } else {
            live.process
        };
        let record = &mut self.processes[process as usize];
        record.exe = exe.as_bytes().to_vec();
        record.argv = argv.iter().map(|arg| arg.as_bytes().to_vec()).collect();
        record.env = env;
        let live = self.live.get_mut(&pid).unwrap();
        (live.process, live.execed) = (process, true);
        let (version, change) = self.files.observe_existing(exe);
        self.relations.changed(change);
        self.relations.used(process, version, true);
    }

    fn exit(&mut self, pid: i32, status: i64, at: Position) {
        self.starting.remove(&pid);
        let Some(live) = self.live.remove(&pid) else {
            return;
        };
        for path in self.files.written(|writer| writer == live.process) {
            self.observe(&path);
        }
        self.name_if_renamed(&live);
        let record = &mut self.processes[live.process as usize];
        record.end_ns = at.guest_ns;
        record.outcome = Some(match status & 0x7f {
            0 => Outcome::Exited(((status >> 8) & 0xff) as i32),
            signal => Outcome::Signaled(signal as i32),
        });
    }

    /// A fork that did not exec is the program its name says.
    fn name_if_renamed(&mut self, live: &Live) {
        let record = &mut self.processes[live.process as usize];
        let comm = live.comm.as_bytes();
        if !live.execed && !comm.is_empty() && record.renamed_to(comm) {
            record.argv = vec![comm.to_vec()];
        }
    }

    /// A successful file call of `process` (thread group `tgid`).
    fn file_call(&mut self, tgid: i32, process: u32, call: &Syscall, ret: i64) {
        let Some(number) = Sysno::new(call.number as usize) else {
            return;
        };
        let paths: Vec<&str> = call
            .args
            .iter()
            .filter_map(|arg| match arg {
                Arg::Path { absolute, .. } => Some(absolute.as_str()),
                _ => None,
            })
            .collect();
        let data = call.args.iter().find_map(|arg| match arg {
            Arg::Data { bytes, .. } => Some(bytes.as_slice()),
            _ => None,
        });
        let raw = |index: usize| match call.args.get(index) {
            Some(Arg::Int { value }) => *value as u64,
            Some(Arg::Hex { value } | Arg::Octal { value } | Arg::OpenFlags { value, .. }) => {
                *value
            }
            _ => 0,
        };
        match number {
            Sysno::open | Sysno::openat => {
                let flags = raw(if number == Sysno::open { 1 } else { 2 });
                self.open(tgid, process, paths[0], flags);
            }
            Sysno::creat => self.open(tgid, process, paths[0], O_CREAT_WRONLY_TRUNC),
            Sysno::read | Sysno::pread64 | Sysno::readv => {
                if let Some(path) = regular_fd(call, 0) {
                    let transfer = placed_if(number == Sysno::read);
                    self.read(tgid, process, path, data.unwrap_or_default(), transfer);
                }
            }
            Sysno::write | Sysno::pwrite64 | Sysno::writev => {
                if let Some(path) = regular_fd(call, 0) {
                    let transfer = placed_if(number == Sysno::write);
                    self.files
                        .write(process, path, data.unwrap_or_default(), transfer);
                }
            }
            Sysno::sendfile | Sysno::copy_file_range => {
                // Which descriptors, and the offset pointers: NULL means
                // at the descriptors' own positions.
                let (from, to, offsets) = if number == Sysno::sendfile {
                    (1, 0, &[2][..])
                } else {
                    (0, 2, &[1, 3][..])
                };
                let at_positions = offsets.iter().all(|&index| raw(index) == 0);
                let (from, to) = (regular_fd(call, from), regular_fd(call, to));
                if let Some(path) = from {
                    self.use_once(process, path);
                }
                match (from, to) {
                    (Some(from), Some(to)) => {
                        let copy = Copy {
                            tgid,
                            len: ret as u64,
                            at_positions,
                        };
                        self.files.copied(process, from, to, copy);
                    }
                    (Some(from), None) => self.files.read(tgid, from, &[], Transfer::Unplaced),
                    (None, Some(to)) => self.files.write(process, to, &[], Transfer::Unplaced),
                    (None, None) => {}
                }
            }
            Sysno::mmap if raw(3) & MAP_SHARED != 0 && raw(2) & PROT_WRITE != 0 => {
                if let Some(path) = regular_fd(call, 4) {
                    self.files.write(process, path, &[], Transfer::Unplaced);
                }
            }
            Sysno::lseek => {
                if let Some(path) = regular_fd(call, 0) {
                    self.files.seeked(tgid, path, ret as u64);
                }
            }
            Sysno::truncate => self.files.truncated(process, paths[0], raw(1)),
            Sysno::ftruncate => {
                if let Some(path) = regular_fd(call, 0) {
                    self.files.truncated(process, path, raw(1));
                }
            }
            Sysno::rename | Sysno::renameat => self.rename(process, paths[0], paths[1]),
            Sysno::renameat2 if raw(4) & RENAME_EXCHANGE == 0 => {
                self.rename(process, paths[0], paths[1]);
            }
            Sysno::link | Sysno::linkat => {
                self.observe(paths[0]);
                if let Some((version, source)) = self.files.linked(paths[0], paths[1]) {
                    self.relations.derived(version, source, process);
                }
            }
            Sysno::unlink => self.unlink(process, paths[0]),
            Sysno::unlinkat if raw(2) & AT_REMOVEDIR == 0 => self.unlink(process, paths[0]),
            _ => {}
        }
    }

    /// `tgid` opened `path` with open(2) `flags`: a read (at the open, as
    /// the agent counts it) unless write-only, and a write if it can write
    /// or truncate.
    fn open(&mut self, tgid: i32, process: u32, path: &str, flags: u64) {
        if flags & (O_PATH | O_DIRECTORY) != 0 {
            return;
        }
        let access = flags & O_ACCMODE;
        if access != O_WRONLY {
            let (version, change) = self.files.observe_existing(path);
            self.relations.changed(change);
            self.relations.used(process, version, false);
            self.files.start_read(tgid, path, version);
            self.read_paths.insert((process, path.to_owned()));
        }
        if access != O_RDONLY || flags & O_TRUNC != 0 {
            self.observe(path);
            self.files.open_write(process, path, flags);
        }
    }

    /// `tgid` read `bytes` of `path`.
    fn read(&mut self, tgid: i32, process: u32, path: &str, bytes: &[u8], transfer: Transfer) {
        self.use_once(process, path);
        self.files.read(tgid, path, bytes, transfer);
    }

    /// `process` read `path` through a descriptor: a use, if it did not
    /// open it itself (it inherited the descriptor).
    fn use_once(&mut self, process: u32, path: &str) {
        if self.read_paths.insert((process, path.to_owned())) {
            let (version, change) = self.files.observe_existing(path);
            self.relations.changed(change);
            self.relations.used(process, version, false);
        }
    }

    fn rename(&mut self, process: u32, from: &str, to: &str) {
        self.observe(from);
        self.observe(to);
        if let Some((version, source)) = self.files.renamed(from, to) {
            self.relations.derived(version, source, process);
            self.relations.invalidated(source, process);
        }
    }

    fn unlink(&mut self, process: u32, path: &str) {
        self.observe(path);
        if let Some(version) = self.files.unlinked(path) {
            self.relations.invalidated(version, process);
        }
    }

    fn observe(&mut self, path: &str) {
        let (_, change) = self.files.observe(path);
        self.relations.changed(change);
    }

    fn new_process(&mut self, pid: i32, env: u32, at: Position) -> u32 {
        let id = self.processes.len() as u32;
        self.processes.push(Process {
            id,
            pid: pid as u32,
            env,
            start_ns: at.guest_ns,
            ..Process::default()
        });
        id
    }

    fn environment(&mut self, entries: Vec<String>) -> u32 {
        let entries = entries.into_iter().map(String::into_bytes).collect();
        let next = self.environments.len() as u32;
        *self.environments.entry(entries).or_insert(next)
    }
}

/// The regular file descriptor argument `index` refers to.
fn regular_fd(call: &Syscall, index: usize) -> Option<&str> {
    match call.args.get(index)? {
        Arg::Fd {
            path: Some(path),
            regular: true,
            ..
        } if !is_kernel_file(path) => Some(path),
        _ => None,
    }
}

fn placed_if(sequential: bool) -> Transfer {
    if sequential {
        Transfer::Sequential
    } else {
        Transfer::Unplaced
    }
}

impl Analysis for DerivedProvenance {
    fn name(&self) -> &'static str {
        "provenance"
    }

    fn syscall(&mut self, call: &Syscall) {
        let tgid = call.task.pid;
        let number = Sysno::new(call.number as usize);
        if matches!(number, Some(Sysno::execve | Sysno::execveat)) {
            let env = call.args.iter().find_map(|arg| match arg {
                Arg::Env { values } => Some(values.clone()),
                _ => None,
            });
            self.exec_env.insert(tgid, env.unwrap_or_default());
        }
        let Some(live) = self.live.get_mut(&tgid) else {
            return;
        };
        live.comm.clone_from(&call.task.comm);
        let process = live.process;
        match call.ret {
            Some(ret) if !(-4095..0).contains(&ret) => self.file_call(tgid, process, call, ret),
            _ => {}
        }
    }

    fn process(&mut self, event: &ProcessEvent, at: Position) {
        self.first_ns.get_or_insert(at.guest_ns);
        match event {
            ProcessEvent::Forked { parent, child } => self.fork(parent.pid, *child, at),
            ProcessEvent::Executed { task, path, argv } => self.exec(task.pid, path, argv, at),
            // A thread's end is not its process's.
            ProcessEvent::Exited { task, status } if task.pid == task.tid => {
                if let Some(live) = self.live.get_mut(&task.pid) {
                    live.comm.clone_from(&task.comm);
                }
                self.exit(task.pid, *status, at);
            }
            ProcessEvent::Exited { .. } => {}
        }
    }

    /// Each process of the job with what it ran, read, wrote, renamed and
    /// deleted (guest seconds from the agent's fork of the job).
    fn report_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let view = RecordsView::new(self.records(0));
        for process in &view.processes {
            let seconds = |ns: u64| ns as f64 / 1e9;
            writeln!(
                out,
                "process {} pid {} {}  [{:.3} .. {:.3}] {}",
                process.id,
                process.pid,
                text(&process.argv.join(&b' ')),
                seconds(process.start_ns),
                seconds(process.end_ns),
                process
                    .outcome
                    .map_or("running".into(), |outcome| outcome.to_string()),
            )?;
            for line in view.lines_of(process.id) {
                writeln!(out, "  {line}")?;
            }
        }
        Ok(())
    }

    fn report_json(&self, out: &mut dyn Write) -> io::Result<()> {
        for record in self.records(0) {
            let mut line = record_json(&record);
            line["analysis"] = self.name().into();
            serde_json::to_writer(&mut *out, &line)?;
            writeln!(out)?;
        }
        Ok(())
    }
}

/// The records, indexed for the text report.
struct RecordsView {
    files: Vec<provm_guest_agent::FileVersion>,
    processes: Vec<Process>,
    relations: Vec<ProvRecord>,
}

impl RecordsView {
    fn new(records: Vec<ProvRecord>) -> Self {
        let mut view = RecordsView {
            files: Vec::new(),
            processes: Vec::new(),
            relations: Vec::new(),
        };
        for record in records {
            match record {
                ProvRecord::File(file) => view.files.push(file),
                ProvRecord::Process(process) => view.processes.push(process),
                ProvRecord::Environment { .. } => {}
                relation => view.relations.push(relation),
            }
        }
        view
    }

    fn file(&self, id: u32) -> String {
        let file = &self.files[id as usize];
        let path = text(&file.path);
        if file.sha256.is_empty() {
            path
        } else {
            let digest = provm_trace::hex(&file.sha256);
            format!("{path} (sha256 {}…, {} bytes)", &digest[..12], file.size)
        }
    }

    /// What `process` did, one line each.
    fn lines_of(&self, process: u32) -> Vec<String> {
        self.relations
            .iter()
            .filter_map(|relation| match *relation {
                ProvRecord::Started {
                    process: p,
                    starter,
                    exec,
                } if p == process => Some(format!(
                    "started by process {starter} ({})",
                    if exec { "exec" } else { "fork" }
                )),
                ProvRecord::Used {
                    process: p,
                    file,
                    execute,
                    ..
                } if p == process => Some(format!(
                    "{} {}",
                    if execute { "ran" } else { "read" },
                    self.file(file)
                )),
                ProvRecord::Generated {
                    file, process: p, ..
                } if p == process => Some(format!("wrote {}", self.file(file))),
                ProvRecord::Derived {
                    file,
                    from,
                    process: p,
                } if p == process => {
                    Some(format!("made {} from {}", self.file(file), self.file(from)))
                }
                ProvRecord::Invalidated {
                    file, process: p, ..
                } if p == process => Some(format!("deleted {}", self.file(file))),
                _ => None,
            })
            .collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A record as a JSON object, `kind` naming it.
fn record_json(record: &ProvRecord) -> serde_json::Value {
    let strings = |items: &[Vec<u8>]| items.iter().map(|item| text(item)).collect::<Vec<_>>();
    match record {
        ProvRecord::Environment { id, entries } => {
            json!({"kind": "environment", "id": id, "entries": strings(entries)})
        }
        ProvRecord::File(file) => json!({
            "kind": "file", "id": file.id, "path": text(&file.path),
            "sha256": (!file.sha256.is_empty()).then(|| provm_trace::hex(&file.sha256)),
            "size": file.size,
        }),
        ProvRecord::Process(process) => json!({
            "kind": "process", "id": process.id, "pid": process.pid,
            "exe": text(&process.exe), "argv": strings(&process.argv), "env": process.env,
            "start_ns": process.start_ns, "end_ns": process.end_ns,
            "outcome": process.outcome.map(|outcome| outcome.to_string()),
        }),
        ProvRecord::Started {
            process,
            starter,
            exec,
        } => json!({"kind": "started", "process": process, "starter": starter, "exec": exec}),
        ProvRecord::Used {
            process,
            file,
            execute,
            seq,
        } => {
            json!({"kind": "used", "process": process, "file": file, "execute": execute, "seq": seq})
        }
        ProvRecord::Generated { file, process, seq } => {
            json!({"kind": "generated", "file": file, "process": process, "seq": seq})
        }
        ProvRecord::Derived {
            file,
            from,
            process,
        } => json!({"kind": "derived", "file": file, "from": from, "process": process}),
        ProvRecord::Invalidated { file, process, seq } => {
            json!({"kind": "invalidated", "file": file, "process": process, "seq": seq})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_analysis::guest::Task;
    use sha2::{Digest, Sha256};

    fn task(pid: i32, comm: &str) -> Task {
        Task {
            pid,
            tid: pid,
            ppid: 1,
            comm: comm.into(),
        }
    }

    fn at(events: u64) -> Position {
        Position {
            events,
            exits: events,
            guest_ns: events * 1000,
        }
    }

    fn call(pid: i32, comm: &str, number: Sysno, args: Vec<Arg>, ret: i64) -> Syscall {
        Syscall {
            task: task(pid, comm),
            number: number.id() as u64,
            name: number.name().into(),
            args,
            ret: Some(ret),
            entry_event: 0,
            entry_ns: 0,
            exit_event: 0,
            exit_ns: 0,
            cpu: 0,
        }
    }

    fn path(absolute: &str) -> Arg {
        Arg::Path {
            name: absolute.into(),
            absolute: absolute.into(),
        }
    }

    fn openat(pid: i32, comm: &str, file: &str, flags: u64) -> Syscall {
        let args = vec![
            Arg::DirFd { fd: -100 },
            path(file),
            Arg::OpenFlags {
                value: flags,
                names: String::new(),
            },
        ];
        call(pid, comm, Sysno::openat, args, 3)
    }

    fn transfer(pid: i32, comm: &str, number: Sysno, file: &str, bytes: &[u8]) -> Syscall {
        let args = vec![
            Arg::Fd {
                fd: 3,
                path: Some(file.into()),
                regular: true,
            },
            Arg::Data {
                len: bytes.len() as u64,
                sha256: String::new(),
                bytes: bytes.to_vec(),
            },
        ];
        call(pid, comm, number, args, bytes.len() as i64)
    }

    /// `sh -c 'sort in.txt > mid.txt; ...'` as busybox runs it: the agent
    /// forks and execs sh; sh forks a child that opens mid.txt, renames
    /// itself sort (no exec), reads in.txt and writes mid.txt.
    #[test]
    fn a_forked_applet_reads_and_writes_as_the_agent_sees_it() {
        let mut derived = DerivedProvenance::default();
        let argv = vec!["sh".to_owned(), "-c".into(), "sort in.txt > mid.txt".into()];
        derived.process(
            &ProcessEvent::Forked {
                parent: task(1, "provm-agent"),
                child: 40,
            },
            at(1),
        );
        // The agent's own calls and the child's before its exec are not
        // the job's.
        derived.syscall(&openat(1, "provm-agent", "/etc/agent", O_RDONLY));
        derived.syscall(&openat(40, "provm-agent", "/etc/child", O_RDONLY));
        derived.process(
            &ProcessEvent::Executed {
                task: task(40, "sh"),
                path: "/bin/busybox".into(),
                argv: argv.clone(),
            },
            at(2),
        );
        derived.process(
            &ProcessEvent::Forked {
                parent: task(40, "sh"),
                child: 41,
            },
            at(3),
        );
        derived.syscall(&openat(41, "sh", "/data/mid.txt", O_CREAT_WRONLY_TRUNC));
        derived.syscall(&openat(41, "sort", "/data/in.txt", O_RDONLY));
        derived.syscall(&transfer(
            41,
            "sort",
            Sysno::read,
            "/data/in.txt",
            b"b\na\n",
        ));
        derived.syscall(&transfer(41, "sort", Sysno::read, "/data/in.txt", b""));
        derived.syscall(&transfer(
            41,
            "sort",
            Sysno::write,
            "/data/mid.txt",
            b"a\nb\n",
        ));
        derived.process(
            &ProcessEvent::Exited {
                task: task(41, "sort"),
                status: 0,
            },
            at(4),
        );
        derived.process(
            &ProcessEvent::Exited {
                task: task(40, "sh"),
                status: 1 << 8,
            },
            at(5),
        );

        let records = derived.records(1_000_000);
        let processes: Vec<&Process> = records
            .iter()
            .filter_map(|record| match record {
                ProvRecord::Process(process) => Some(process),
                _ => None,
            })
            .collect();
        assert_eq!(processes.len(), 2, "{records:#?}");
        assert_eq!(
            processes[0].argv,
            argv.iter()
                .map(|a| a.as_bytes().to_vec())
                .collect::<Vec<_>>()
        );
        assert_eq!(processes[0].outcome, Some(Outcome::Exited(1)));
        assert_eq!(processes[0].start_ns, 1_000_000 + 1000);
        assert_eq!(processes[1].argv, [b"sort".to_vec()]);
        let files: Vec<&provm_guest_agent::FileVersion> = records
            .iter()
            .filter_map(|record| match record {
                ProvRecord::File(file) => Some(file),
                _ => None,
            })
            .collect();
        let named = |name: &str| {
            files
                .iter()
                .find(|file| file.path == name.as_bytes())
                .unwrap_or_else(|| panic!("no version of {name}: {files:#?}"))
        };
        assert!(files.iter().all(|file| !file.path.starts_with(b"/etc")));
        assert_eq!(
            named("/data/in.txt").sha256,
            Sha256::digest(b"b\na\n").to_vec()
        );
        let mid = named("/data/mid.txt");
        assert_eq!(mid.sha256, Sha256::digest(b"a\nb\n").to_vec());
        assert!(records.contains(&ProvRecord::Started {
            process: 1,
            starter: 0,
            exec: false
        }));
        assert!(records.iter().any(|record| matches!(
            record,
            ProvRecord::Generated { file, process: 1, .. } if *file == mid.id
        )));
        assert!(records.iter().any(|record| matches!(
            record,
            ProvRecord::Used {
                process: 0,
                execute: true,
                ..
            }
        )));

        let mut text = Vec::new();
        derived.report_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("process 1 pid 41 sort"), "{text}");
        assert!(text.contains("  wrote /data/mid.txt (sha256 "), "{text}");
    }
}
