//! `syscalls`: every system call of every guest process, as the replay
//! analysis `syscalls` reads them (provm-analysis). The trace does not hold
//! them: filling the table replays the run, which `provm query` does only
//! for a query that reads it, and `export sqlite` only when asked.

use provm_analysis::syscall::Arg;

use super::Kind::{Integer, Text};
use super::{column, Rows, Table};
use crate::analyses::syscalls::SyscallLog;
use crate::query::{QueryError, Run};
use provm_engine::replay::{self, ReplayOptions};

pub const SYSCALLS: Table = Table {
    name: "syscalls",
    doc: "one row per system call of any guest process (filled by replaying the run)",
    columns: &[
        column("pid", Integer, "the calling process (thread group) id"),
        column("tid", Integer, "the calling thread id"),
        column("ppid", Integer, "its parent's pid"),
        column(
            "comm",
            Text,
            "the process's name at the return (after an exec: the new one)",
        ),
        column("name", Text, "the call, e.g. openat"),
        column("number", Integer, "the x86-64 call number"),
        column(
            "args",
            Text,
            "its arguments decoded, a JSON array (paths resolved, buffers digested)",
        ),
        column(
            "path",
            Text,
            "the first file it names: a path argument made absolute, or a descriptor's file",
        ),
        column(
            "ret",
            Integer,
            "what it returned (-errno on failure); NULL for a call that never returned",
        ),
        column("entry_event", Integer, "the log event index at its entry"),
        column("exit_event", Integer, "the log event index at its return"),
        column("entry_ns", Integer, "guest monotonic time at its entry"),
        column("exit_ns", Integer, "guest monotonic time at its return"),
        column(
            "cpu",
            Integer,
            "the vCPU it was made on, from 0 (it may return on another)",
        ),
    ],
    indexes: &["name", "pid", "path"],
    fill,
    from_replay: true,
};

fn fill(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    eprintln!("provm: replaying {} for the syscalls table", run.name);
    let options = ReplayOptions::for_analysis(run.trace.path.clone());
    let (report, log) = replay::replay_with(&options, SyscallLog::default())
        .map_err(|error| QueryError::Replay(error.to_string()))?;
    report.analysable().map_err(QueryError::Replay)?;
    for call in &log.calls {
        let path = call.args.iter().find_map(|arg| match arg {
            Arg::Path { absolute, .. } => Some(absolute.as_str()),
            Arg::Fd { path, .. } => path.as_deref(),
            _ => None,
        });
        let args = serde_json::to_string(&call.args).expect("arguments serialise");
        // SQLite's integers are i64; counts and guest times stay below 2^63.
        let [number, entry_event, exit_event, entry_ns, exit_ns] = [
            call.number,
            call.entry_event,
            call.exit_event,
            call.entry_ns,
            call.exit_ns,
        ]
        .map(|value| value as i64);
        rows.insert(&[
            &call.task.pid,
            &call.task.tid,
            &call.task.ppid,
            &call.task.comm,
            &call.name,
            &number,
            &args,
            &path,
            &call.ret,
            &entry_event,
            &exit_event,
            &entry_ns,
            &exit_ns,
            &(call.cpu as i64),
        ])?;
    }
    Ok(())
}
