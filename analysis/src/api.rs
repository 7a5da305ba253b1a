//! The analysis API: what an analysis sees of a replay.
//!
//! An analysis implements [`Analysis`]; every callback has a default that
//! ignores it, so an analysis implements only what it looks at. Several run
//! in one replay (see `Instrument`), each called in turn at each point. To
//! add one: implement the trait (see provm's `analyses::processes` for a
//! small example), and list it in `analyses::by_name` (src/analyses/) to
//! make it a `provm replay --analyze` name.

use std::any::Any;
use std::io::{self, Write};

use provm_seams::Position;
use provm_trace::events::Event;
use serde::Serialize;

use crate::guest::{Guest, Task};
use crate::syscall::Syscall;

/// A change in the guest's processes, derived from system calls and the
/// kernel's exit path.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProcessEvent {
    /// `parent` made a new process (fork, vfork, clone without
    /// CLONE_THREAD); `child` is its pid.
    Forked { parent: Task, child: i32 },
    /// `task` replaced its program: `path` with `argv`.
    Executed {
        task: Task,
        path: String,
        argv: Vec<String>,
    },
    /// `task` ended with `status` as wait(2) reports it (exit code << 8,
    /// or the signal).
    Exited { task: Task, status: i64 },
}

/// `Any`: whoever made an analysis gets it back by its type after the
/// replay (`Box<dyn Any>::downcast`), to use what it found.
pub trait Analysis: Any + Send {
    /// The name `--analyze` knows it by.
    fn name(&self) -> &'static str;

    /// Every event of the log, as the replay consumes it.
    fn event(&mut self, _index: u64, _event: &Event) {}

    /// Every debug stop, with the guest to look at (registers, memory,
    /// processes). Looking must not change it.
    fn stop(&mut self, _guest: &Guest, _at: Position) {}

    /// Every system call, when it returns (or, for exit, when it ends).
    fn syscall(&mut self, _call: &Syscall) {}

    /// Every process change, at its position in the replay.
    fn process(&mut self, _event: &ProcessEvent, _at: Position) {}

    /// Writes what it found, for people.
    fn report_text(&self, out: &mut dyn Write) -> io::Result<()>;

    /// Writes what it found as JSON lines.
    fn report_json(&self, out: &mut dyn Write) -> io::Result<()>;
}
