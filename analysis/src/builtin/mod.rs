//! The analyses `provm replay --analyze NAME` runs.

pub mod processes;
pub mod provenance;
pub mod syscalls;

use crate::api::Analysis;

/// The names `--analyze` takes.
pub const NAMES: &[&str] = &["syscalls", "processes", "provenance"];

/// A new analysis by its `--analyze` name.
pub fn by_name(name: &str) -> Option<Box<dyn Analysis>> {
    Some(match name {
        "syscalls" => Box::new(syscalls::SyscallLog::default()),
        "processes" => Box::new(processes::ProcessTree::default()),
        "provenance" => Box::new(provenance::DerivedProvenance::default()),
        _ => return None,
    })
}
