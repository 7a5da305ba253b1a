//! `provm replay --explain`: who wrote the files whose pages differ. The
//! guest's memory at a state check says whose page it is then (a file's
//! page cache, a process), not who put the bytes there; a second replay
//! watching system calls names the processes that wrote to each file
//! (through write(2) and its kin: a shared mapping's stores are not seen).

use std::io::{self, Write};

use provm_analysis::page_owner::KernelUse;
use provm_analysis::syscall::{Arg, Syscall};
use provm_analysis::Analysis;
use provm_engine::explain::{Explanation, MemoryExplanation};
use provm_engine::replay::{self, ReplayError, ReplayOptions};

/// The system calls that write a descriptor's file from a buffer.
const WRITES: &[&str] = &["write", "pwrite64", "writev", "pwritev", "pwritev2"];

/// For each file that owns a differing page, the processes that wrote it,
/// as lines to print.
pub fn writers(
    options: &ReplayOptions,
    explanation: &Explanation,
) -> Result<Vec<String>, ReplayError> {
    let MemoryExplanation::Pages { pages, .. } = &explanation.memory else {
        return Ok(Vec::new());
    };
    let mut files: Vec<String> = pages
        .iter()
        .filter_map(|page| match &page.owner.as_ref()?.kernel {
            KernelUse::File { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect();
    files.dedup();
    if files.is_empty() {
        return Ok(Vec::new());
    }
    // Whatever its verdict, the analysis saw the run up to the divergence.
    let (_, found) = replay::replay_with(
        options,
        FileWriters {
            files,
            writes: Vec::new(),
        },
    )?;
    Ok(found
        .files
        .iter()
        .map(|file| format!("  the file {file} was written by: {}", found.written(file)))
        .collect())
}

/// Watches the replay for writes to files whose path ends in one of
/// `files` (paths from their file system's root, as a page's owner names
/// them: the mount point is not known there).
struct FileWriters {
    files: Vec<String>,
    /// (file, writer, the path it wrote by), in order.
    writes: Vec<(String, String, String)>,
}

impl FileWriters {
    fn written(&self, file: &str) -> String {
        let mut writers: Vec<String> = self
            .writes
            .iter()
            .filter(|(written, ..)| written == file)
            .map(|(_, writer, path)| format!("{writer} as {path}"))
            .collect();
        writers.dedup();
        if writers.is_empty() {
            return "no process through write(2) (the kernel, or a shared mapping)".into();
        }
        writers.join(", ")
    }
}

impl Analysis for FileWriters {
    fn name(&self) -> &'static str {
        "file-writers"
    }

    fn syscall(&mut self, call: &Syscall) {
        if !WRITES.contains(&call.name.as_str()) || call.ret.is_none_or(|ret| ret <= 0) {
            return;
        }
        let Some(Arg::Fd {
            path: Some(path), ..
        }) = call.args.first()
        else {
            return;
        };
        for file in &self.files {
            if path.ends_with(file.as_str()) {
                let writer = format!("pid {} ({})", call.task.pid, call.task.comm);
                self.writes.push((file.clone(), writer, path.clone()));
            }
        }
    }

    fn report_text(&self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }

    fn report_json(&self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }
}
