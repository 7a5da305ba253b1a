//! `--analyze syscalls`: an strace-like log of every process in the guest.

use std::io::{self, Write};

use serde::Serialize;

use provm_analysis::api::Analysis;
use provm_analysis::syscall::Syscall;

#[derive(Default)]
pub struct SyscallLog {
    pub calls: Vec<Syscall>,
}

/// A JSON line of the log.
#[derive(Serialize)]
struct Line<'a> {
    analysis: &'static str,
    #[serde(flatten)]
    call: &'a Syscall,
}

impl Analysis for SyscallLog {
    fn name(&self) -> &'static str {
        "syscalls"
    }

    fn syscall(&mut self, call: &Syscall) {
        self.calls.push(call.clone());
    }

    /// One line per call, as strace -f writes it, with the guest time (s).
    fn report_text(&self, out: &mut dyn Write) -> io::Result<()> {
        for call in &self.calls {
            writeln!(
                out,
                "{:>12.6} [pid {:>5}] {:<15} {call}",
                call.entry_ns as f64 / 1e9,
                call.task.tid,
                call.task.comm,
            )?;
        }
        Ok(())
    }

    fn report_json(&self, out: &mut dyn Write) -> io::Result<()> {
        for call in &self.calls {
            serde_json::to_writer(
                &mut *out,
                &Line {
                    analysis: self.name(),
                    call,
                },
            )?;
            writeln!(out)?;
        }
        Ok(())
    }
}
