//! `provm inspect`: what a trace holds, after verifying all of it, and
//! whether this provm replays it. Of a trace of a format it does not read,
//! what it can read: the manifest's fields, and why replay would refuse.

use std::fmt::Write;
use std::path::Path;

use provm_seams::state_check;
use provm_trace::events::{Event, EventKind};
use provm_trace::format::{FormatError, FORMAT_VERSION, OLDEST_FORMAT};
use provm_trace::manifest::InterruptDelivery;
use provm_trace::page_digests::{self, CheckPoint};
use provm_trace::reader::{Trace, Unreadable};
use provm_vmm::machine_version;

use provm_engine::disk::chain;
use provm_engine::holes;
use provm_engine::utc::date_time as utc_date_time;

/// A manifest field of an unreadable trace is shown up to this many
/// characters.
const FIELD_WIDTH: usize = 100;

pub fn inspect(path: &Path) -> Result<String, FormatError> {
    match Trace::open(path) {
        Ok(trace) => readable(path, &trace),
        Err(refusal @ (FormatError::NewerFormat { .. } | FormatError::RetiredFormat { .. })) => {
            unreadable(path, &refusal)
        }
        Err(error) => Err(error),
    }
}

/// `provm inspect --state`: every state check the trace holds, the memory
/// digest each compares, and whether it kept the page digests that name
/// the pages where memory differs (format 8 on).
pub fn state_checks(path: &Path) -> Result<String, FormatError> {
    let trace = Trace::open(path)?;
    let kept = match &trace.page_digests {
        Some(payload) => page_digests::decode(payload)?,
        None => Vec::new(),
    };
    let pages = |at: CheckPoint| match kept.iter().find(|check| check.at == at) {
        Some(check) => format!(
            "{} pages digested",
            check.pieces.len() / page_digests::PIECES_PER_PAGE
        ),
        None => "no page digests".into(),
    };
    let mut out = String::new();
    let mut events = trace.events()?;
    let mut index = 0;
    while let Some(event) = events.next_event()? {
        if let Event::StateCheck { memory } = event {
            let _ = writeln!(
                out,
                "event {index:>10}  memory {memory:016x}, {}",
                pages(CheckPoint::Event(index))
            );
        }
        index += 1;
    }
    match &trace.outcome.state_check {
        Some(last) => {
            let _ = writeln!(
                out,
                "power-off         memory {}, registers {}, {} devices, {}",
                last.memory,
                last.registers,
                last.devices.len(),
                pages(CheckPoint::PowerOff)
            );
        }
        None if out.is_empty() => out.push_str("no state checks\n"),
        None => {}
    }
    Ok(out)
}

/// What a trace of another format holds, as far as this provm can tell.
fn unreadable(path: &Path, refusal: &FormatError) -> Result<String, FormatError> {
    let peeked = Unreadable::peek(path)?;
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = (|| -> std::fmt::Result {
        writeln!(out, "trace      {}", path.display())?;
        writeln!(
            out,
            "format     {} (this provm reads {OLDEST_FORMAT} to {FORMAT_VERSION})",
            peeked.format_version
        )?;
        writeln!(out, "replay     refused: {refusal}")?;
        match &peeked.manifest {
            Ok(serde_json::Value::Object(fields)) => {
                writeln!(
                    out,
                    "manifest   as far as this provm can read it (checksum verified, fields not):"
                )?;
                for (name, value) in fields {
                    let mut value = value.to_string();
                    if value.chars().count() > FIELD_WIDTH {
                        value = value.chars().take(FIELD_WIDTH).collect::<String>() + "...";
                    }
                    writeln!(out, "  {name:<22} {value}")?;
                }
            }
            Ok(other) => writeln!(out, "manifest   not an object: {other}")?,
            Err(error) => writeln!(out, "manifest   unreadable: {error}")?,
        }
        Ok(())
    })();
    Ok(out)
}

fn readable(path: &Path, trace: &Trace) -> Result<String, FormatError> {
    let counts = trace.count_events()?;
    let (m, o) = (&trace.manifest, &trace.outcome);
    let mut out = String::new();
    let total: u64 = trace.stored_bytes.values().sum();
    // Writing to a String cannot fail.
    let _ = (|| -> std::fmt::Result {
        writeln!(out, "trace      {}", path.display())?;
        writeln!(out, "integrity  verified: every section's SHA-256, the event chunks' sequence, the embedded kernel, initramfs and snapshot against the manifest")?;
        writeln!(
            out,
            "format     {} (this provm reads {OLDEST_FORMAT} to {FORMAT_VERSION})",
            trace.format_version
        )?;
        match machine_version::supported(m.machine_version) {
            Ok(version) => writeln!(
                out,
                "replay     this provm replays it: machine version {}, {}",
                version.number, version.description
            )?,
            Err(refusal) => writeln!(out, "replay     refused: {refusal}")?,
        }
        writeln!(
            out,
            "status     {}",
            if o.complete { "complete" } else { "INCOMPLETE" }
        )?;
        writeln!(out, "ended      {}", o.ended)?;
        if let Some(status) = o.exit_status {
            writeln!(out, "exit       {status}")?;
        }
        if let Some(fork) = &m.fork {
            writeln!(
                out,
                "fork of    {} at {} (event {}), fault {}",
                fork.trace,
                fork.at,
                o.fork_event.map_or("?".into(), |event| event.to_string()),
                fork.fault
            )?;
        }
        writeln!(out, "command    {:?}", m.argv)?;
        writeln!(out, "cwd        {}", m.cwd)?;
        if let Some(user) = &m.user {
            writeln!(out, "user       {user}")?;
        }
        for input in &m.inputs {
            writeln!(
                out,
                "input      {} -> {} ({} files, {} bytes, sha256 {})",
                input.host, input.guest, input.files, input.bytes, input.sha256
            )?;
        }
        if let Some(disk) = &m.input_disk {
            writeln!(
                out,
                "input disk {} bytes, sha256 {}{}",
                disk.bytes,
                disk.sha256,
                if trace.has_input_disk {
                    " (embedded)"
                } else {
                    ""
                }
            )?;
        }
        if let Some(stdin) = &m.stdin {
            writeln!(
                out,
                "stdin      {} bytes, sha256 {}",
                stdin.bytes, stdin.sha256
            )?;
        }
        if m.stdin_live {
            writeln!(
                out,
                "stdin      live: streamed as the command ran (in the log)"
            )?;
        }
        if let Some(size) = &m.terminal {
            writeln!(
                out,
                "terminal   {}x{} at the start: the command ran on a terminal in the guest, typed at (what was typed and each new size are in the log)",
                size.columns, size.rows
            )?;
        }
        for output in &m.outputs {
            writeln!(
                out,
                "output     {output} (`provm export files` gets it back)"
            )?;
        }
        writeln!(
            out,
            "recorded   {} by provm {}{} on {} ({}, Linux {})",
            utc_date_time(m.started_unix),
            m.provm_version,
            m.provm_commit
                .as_ref()
                .map_or(String::new(), |commit| format!(" (commit {commit})")),
            m.host.hypervisor,
            m.host.cpu,
            m.host.kernel
        )?;
        writeln!(
            out,
            "cpu        {} ({} CPUID entries{})",
            m.cpu.baseline.as_deref().unwrap_or("host"),
            m.cpu.cpuid.len(),
            if m.cpu.user_space_cpuid.is_some() {
                "; user space saw the host's own CPUID"
            } else {
                ""
            }
        )?;
        match &m.holes {
            Some(ids) if ids.is_empty() => writeln!(
                out,
                "holes      none: every input the guest took was logged"
            )?,
            Some(ids) => {
                writeln!(out, "holes      unlogged inputs this host left open:")?;
                for line in holes::describe(ids) {
                    writeln!(out, "  {line}")?;
                }
            }
            None => writeln!(out, "holes      not recorded (a trace of an older provm)")?,
        }
        writeln!(
            out,
            "interrupts {}",
            match m.interrupt_delivery {
                InterruptDelivery::Doorbell => "at the guest kernel's doorbell exits (any host)",
                InterruptDelivery::WindowExit =>
                    "at KVM's interrupt-window exits (replays on SVM and VMX, not PVM)",
            }
        )?;
        writeln!(
            out,
            "image      {}{}",
            m.image.path,
            if trace.has_image { " (embedded)" } else { "" }
        )?;
        if let Some(container) = &m.image.container {
            writeln!(
                out,
                "  made of the container image {} ({} {})",
                container.reference, container.digest_of, container.digest
            )?;
        }
        for file in &m.image.chain {
            writeln!(
                out,
                "  {}: {} ({} bytes, sha256 {})",
                chain::describe(file),
                file.path,
                file.size,
                file.sha256
            )?;
        }
        writeln!(out, "kernel     sha256 {}", m.kernel_sha256)?;
        writeln!(out, "initramfs  sha256 {}", m.initramfs_sha256)?;
        writeln!(out, "snapshot   sha256 {}", m.snapshot_sha256)?;
        writeln!(
            out,
            "machine    version {}, {} MiB, {}, cmdline {:?}",
            m.machine_version,
            m.memory_mib,
            vcpus(m.cpus, m.chaos_seed),
            m.kernel_cmdline
        )?;
        writeln!(
            out,
            "guest time {:.3} s (host {:.3} s{})",
            o.guest_ns as f64 / 1e9,
            o.host_seconds,
            o.longest_exitless_seconds
                .map(|s| format!("; at most {s:.3} s between two VM exits"))
                .unwrap_or_default()
        )?;
        writeln!(
            out,
            "disk       {} writes, sha256 {}",
            o.disk_writes, o.disk_writes_sha256
        )?;
        if let Some(digest) = &o.events_sha256 {
            writeln!(out, "event log  sha256 {digest}")?;
        }
        writeln!(
            out,
            "events     {} ({} VM exits) in {} chunks",
            o.events, o.exits, o.event_chunks
        )?;
        for (kind, count) in &counts {
            writeln!(out, "  {:<20} {count}", kind.name())?;
        }
        let periodic = counts.get(&EventKind::StateCheck).copied();
        let checks = state_check::described(periodic.unwrap_or(0), o.state_check.as_ref());
        writeln!(out, "state      {checks}")?;
        writeln!(out, "size       {total} bytes")?;
        for (kind, bytes) in &trace.stored_bytes {
            writeln!(out, "  {:<20} {bytes}", kind.name())?;
        }
        Ok(())
    })();
    Ok(out)
}

/// The guest's vCPUs, and the seed of a chaos schedule.
fn vcpus(cpus: u8, chaos_seed: Option<u64>) -> String {
    let count = match cpus {
        1 => "1 vCPU".to_owned(),
        n => format!("{n} vCPUs"),
    };
    match chaos_seed {
        Some(seed) => format!("{count} (schedule from --chaos {seed})"),
        None => count,
    }
}
