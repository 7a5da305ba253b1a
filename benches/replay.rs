//! Record and replay cost: `provm record` and `provm replay` against QEMU's
//! own record/replay under TCG as the reference, on the workloads the
//! record/replay tests use, same kernel, initramfs and image. Every time is a
//! whole run, boot included. Run by benches/bench.sh; prints one table.

// The tests' image builder and workloads.
#[path = "../tests/common/mod.rs"]
mod common;

// Shared with the boot bench, which does not use QEMU's record/replay.
#[allow(dead_code)]
mod qemu;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use provm_engine::start::RunOptions;
use provm_guest_agent::{GuestMessage, Job, Outcome};

fn main() {
    let image = &common::images().tiny_qcow2;
    let options = RunOptions::new(image.clone(), Vec::new());
    let prepared = provm_engine::start::prepare(&options).unwrap();
    let machine = qemu::Machine::new(&prepared.boot, prepared.memory_mib, image);
    let provm = provm_binary();
    let dir = tempfile::tempdir().unwrap();

    println!(
        "| workload | provm run s | provm record s | record/run | provm replay s | replay/record \
         | trace bytes | event log bytes | log bytes per guest-second | log bytes per event \
         | QEMU TCG record s | QEMU replay s | QEMU rr log bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    // The first run of the image boots the guest and caches its snapshot;
    // every timed provm command starts from that snapshot.
    time(
        Command::new(&provm)
            .arg("run")
            .arg(image)
            .args(["--", "true"]),
    )
    .expect("provm run works");
    for (name, script) in common::RECORD_WORKLOADS {
        let ours = measure_provm(&provm, image, script, &dir.path().join("trace.provm"));
        let reference = measure_qemu(
            &machine,
            common::shell_job(&options, script),
            &dir.path().join("qemu.rr"),
        );
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let replay_seconds = ours.replay.map(|r| r.seconds);
        let log_bytes = ours.log_bytes.map(|b| b as f64);
        let per = |count: fn(&Replayed) -> f64| Some(log_bytes? / count(ours.replay.as_ref()?));
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3}{} | {} |",
            cell(ours.run, 3),
            cell(ours.record, 3),
            cell(ratio(ours.record, ours.run), 2),
            cell(replay_seconds, 3),
            cell(ratio(replay_seconds, ours.record), 2),
            cell(ours.trace_bytes.map(|b| b as f64), 0),
            cell(log_bytes, 0),
            cell(per(|r| r.guest_seconds), 0),
            cell(per(|r| r.events as f64), 1),
            reference.record_seconds,
            reference.replay_seconds,
            if reference.matched {
                ""
            } else {
                " (output differs)"
            },
            reference.log_bytes,
        );
    }
    println!();
    println!(
        "Times are wall-clock seconds for the whole run, guest boot and power-off \
         included: provm's from process start to exit (the guest restored from its \
         cached snapshot), QEMU's from its start to its exit (a full boot). A trace \
         also holds the kernel, initramfs and snapshot (about 5 MB); the event log \
         is what grows with the run. n/a: the provm command failed. QEMU: TCG, -M \
         microvm, -icount shift=auto,rr=record|replay, disk through blkreplay; its \
         record ends with SIGTERM once the guest has halted (microvm without ACPI \
         cannot power off), its replay ends by itself at that logged shutdown and is \
         checked to give the record's agent messages and console, byte for byte."
    );
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.decimals$}"))
}

/// The release binary beside this bench's own (target/release/deps/replay-*),
/// built by benches/bench.sh.
fn provm_binary() -> PathBuf {
    let bench = std::env::current_exe().unwrap();
    let binary = bench.parent().unwrap().with_file_name("provm");
    assert!(
        binary.exists(),
        "{} is missing: run cargo build --release",
        binary.display()
    );
    binary
}

/// provm's side, in seconds; None where a subcommand failed.
struct Provm {
    run: Option<f64>,
    record: Option<f64>,
    trace_bytes: Option<u64>,
    /// The compressed event log's share of the trace.
    log_bytes: Option<u64>,
    replay: Option<Replayed>,
}

#[derive(Clone, Copy)]
struct Replayed {
    seconds: f64,
    events: u64,
    guest_seconds: f64,
}

fn measure_provm(provm: &Path, image: &Path, script: &str, trace: &Path) -> Provm {
    let command = ["--", "/bin/sh", "-c", script];
    let run = time(Command::new(provm).arg("run").arg(image).args(command)).map(|(s, _)| s);
    let _ = std::fs::remove_file(trace);
    let record = time(
        Command::new(provm)
            .arg("record")
            .arg(image)
            .arg("-o")
            .arg(trace)
            .args(command),
    )
    .map(|(s, _)| s);
    let trace_bytes = record.and_then(|_| Some(std::fs::metadata(trace).ok()?.len()));
    let replay = trace_bytes
        .and_then(|_| time(Command::new(provm).arg("replay").arg(trace)))
        .and_then(|(seconds, output)| {
            let (events, guest_seconds) = replay_matched(&output)?;
            Some(Replayed {
                seconds,
                events,
                guest_seconds,
            })
        });
    let log_bytes = trace_bytes
        .and_then(|_| time(Command::new(provm).arg("inspect").arg(trace)))
        .and_then(|(_, output)| event_log_bytes(&output));
    Provm {
        run,
        record,
        trace_bytes,
        log_bytes,
        replay,
    }
}

/// Runs `command` to its end: its seconds and output (stdout then stderr)
/// if it succeeded.
fn time(command: &mut Command) -> Option<(f64, String)> {
    let start = Instant::now();
    let output = command.output().unwrap();
    let seconds = start.elapsed().as_secs_f64();
    output.status.success().then(|| {
        let text = [output.stdout, output.stderr].concat();
        (seconds, String::from_utf8_lossy(&text).into_owned())
    })
}

/// The events section's size from `provm inspect`'s size table.
fn event_log_bytes(inspect: &str) -> Option<u64> {
    let sizes = inspect.split_once("\nsize ")?.1;
    sizes
        .lines()
        .find_map(|line| line.strip_prefix("  events "))?
        .trim()
        .parse()
        .ok()
}

/// N and M from provm replay's "replay matched: N events, M guest-seconds".
fn replay_matched(output: &str) -> Option<(u64, f64)> {
    let line = output
        .lines()
        .find_map(|line| line.trim().strip_prefix("replay matched: "))?;
    let (events, rest) = line.split_once(" events, ")?;
    let guest_seconds = rest.strip_suffix(" guest-seconds")?;
    Some((events.parse().ok()?, guest_seconds.parse().ok()?))
}

/// QEMU's side: one recorded run (boot, the job, power-off), then its replay.
struct QemuRr {
    record_seconds: f64,
    replay_seconds: f64,
    log_bytes: u64,
    /// The replay ended by itself with the record's agent messages and console.
    matched: bool,
}

fn measure_qemu(machine: &qemu::Machine, job: Job, log: &Path) -> QemuRr {
    let start = Instant::now();
    let mut guest = machine.boot(qemu::Accel::Tcg, qemu::Rr::Record(log));
    let messages = guest.run(job);
    let console = guest.power_off();
    let record_seconds = start.elapsed().as_secs_f64();
    assert_eq!(
        messages.last(),
        Some(&GuestMessage::Finished(Outcome::Exited(0))),
        "the workload failed under QEMU: {messages:?}"
    );

    let start = Instant::now();
    let (replayed, replayed_console) = machine
        .boot(qemu::Accel::Tcg, qemu::Rr::Replay(log))
        .replay_to_end();
    QemuRr {
        record_seconds,
        replay_seconds: start.elapsed().as_secs_f64(),
        log_bytes: std::fs::metadata(log).unwrap().len(),
        matched: replayed == messages && replayed_console == console,
    }
}
