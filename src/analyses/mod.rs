//! The analyses `provm replay --analyze NAME` runs: features written
//! against provm-analysis's `Analysis` trait, which hands them a replay's
//! system calls and process events. `syscalls` and `processes` are here;
//! `provenance` is the provenance feature's (`provenance::DerivedProvenance`,
//! which `provm graph` also replays a trace with).

pub mod processes;
pub mod syscalls;

use provm_analysis::api::Analysis;

/// The names `--analyze` takes.
pub const NAMES: &[&str] = &["syscalls", "processes", "provenance"];

/// A new analysis by its `--analyze` name.
pub fn by_name(name: &str) -> Option<Box<dyn Analysis>> {
    Some(match name {
        "syscalls" => Box::new(syscalls::SyscallLog::default()),
        "processes" => Box::new(processes::ProcessTree::default()),
        "provenance" => Box::new(crate::provenance::DerivedProvenance::default()),
        _ => return None,
    })
}
