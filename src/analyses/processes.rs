//! `--analyze processes`: the guest's process tree, with each process's
//! program, arguments, start and end (guest seconds) and exit status.

use std::collections::BTreeMap;
use std::io::{self, Write};

use provm_seams::Position;
use serde::Serialize;

use provm_analysis::api::{Analysis, ProcessEvent};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Process {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    /// The programs it ran, in order (a process may exec several times).
    pub execs: Vec<(String, Vec<String>)>,
    /// Guest nanoseconds, when seen.
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
    /// As wait(2) reports it.
    pub status: Option<i64>,
}

#[derive(Default)]
pub struct ProcessTree {
    pub processes: BTreeMap<i32, Process>,
}

impl ProcessTree {
    fn entry(&mut self, pid: i32) -> &mut Process {
        self.processes.entry(pid).or_insert_with(|| Process {
            pid,
            ..Process::default()
        })
    }

    fn write_subtree(&self, out: &mut dyn Write, pid: i32, depth: usize) -> io::Result<()> {
        let process = &self.processes[&pid];
        let seconds =
            |ns: Option<u64>| ns.map_or("?".into(), |ns| format!("{:.3}", ns as f64 / 1e9));
        let program = process
            .execs
            .last()
            .map_or(process.comm.clone(), |(_, argv)| argv.join(" "));
        let status = process.status.map_or("running".into(), describe_status);
        writeln!(
            out,
            "{:indent$}{} {}  [{} .. {}] {}",
            "",
            process.pid,
            program,
            seconds(process.start_ns),
            seconds(process.end_ns),
            status,
            indent = depth * 2
        )?;
        for child in self
            .processes
            .values()
            .filter(|p| p.ppid == pid && p.pid != pid)
        {
            self.write_subtree(out, child.pid, depth + 1)?;
        }
        Ok(())
    }
}

/// A wait(2) status in words.
fn describe_status(status: i64) -> String {
    match status & 0x7f {
        0 => format!("exit {}", (status >> 8) & 0xff),
        signal => format!("killed by signal {signal}"),
    }
}

impl Analysis for ProcessTree {
    fn name(&self) -> &'static str {
        "processes"
    }

    fn process(&mut self, event: &ProcessEvent, at: Position) {
        match event {
            ProcessEvent::Forked { parent, child } => {
                let parent = parent.clone();
                let entry = self.entry(parent.pid);
                entry.ppid = parent.ppid;
                entry.comm.clone_from(&parent.comm);
                let child = self.entry(*child);
                child.ppid = parent.pid;
                child.comm = parent.comm;
                child.start_ns = Some(at.guest_ns);
            }
            ProcessEvent::Executed { task, path, argv } => {
                let entry = self.entry(task.pid);
                entry.ppid = task.ppid;
                entry.comm.clone_from(&task.comm);
                entry.execs.push((path.clone(), argv.clone()));
            }
            // A thread's end is not its process's.
            ProcessEvent::Exited { task, status } if task.pid == task.tid => {
                let entry = self.entry(task.pid);
                entry.ppid = task.ppid;
                entry.end_ns = Some(at.guest_ns);
                entry.status = Some(*status);
            }
            ProcessEvent::Exited { .. } => {}
        }
    }

    /// The tree from each process whose parent was not seen.
    fn report_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let roots = self
            .processes
            .values()
            .filter(|p| !self.processes.contains_key(&p.ppid) || p.ppid == p.pid);
        for root in roots {
            self.write_subtree(out, root.pid, 0)?;
        }
        Ok(())
    }

    fn report_json(&self, out: &mut dyn Write) -> io::Result<()> {
        for process in self.processes.values() {
            let mut line = serde_json::to_value(process)?;
            line["analysis"] = self.name().into();
            serde_json::to_writer(&mut *out, &line)?;
            writeln!(out)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_analysis::guest::Task;

    fn task(pid: i32, ppid: i32, comm: &str) -> Task {
        Task {
            pid,
            tid: pid,
            ppid,
            comm: comm.into(),
        }
    }

    #[test]
    fn a_fork_exec_exit_makes_a_child_with_its_program_and_status() {
        let mut tree = ProcessTree::default();
        let at = |guest_ns| Position {
            events: 0,
            exits: 0,
            guest_ns,
        };
        tree.process(
            &ProcessEvent::Forked {
                parent: task(10, 1, "sh"),
                child: 11,
            },
            at(1_000_000_000),
        );
        tree.process(
            &ProcessEvent::Executed {
                task: task(11, 10, "cat"),
                path: "/bin/cat".into(),
                argv: vec!["cat".into(), "/data/in.txt".into()],
            },
            at(1_100_000_000),
        );
        tree.process(
            &ProcessEvent::Exited {
                task: task(11, 10, "cat"),
                status: 1 << 8,
            },
            at(1_500_000_000),
        );
        let mut text = Vec::new();
        tree.report_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("10 sh"), "{text}");
        assert!(
            text.contains("  11 cat /data/in.txt  [1.000 .. 1.500] exit 1"),
            "{text}"
        );
    }
}
