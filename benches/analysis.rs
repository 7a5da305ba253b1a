//! What watching a replay costs: one recording replayed plainly and with
//! each built-in analysis (`--analyze syscalls`, `processes`, `provenance`,
//! and all three), five replays of each, alternated so that a slow stretch
//! of a shared host hits all alike. Each time is a whole `provm replay`
//! command: open and verify the trace, restore the snapshot, replay to the
//! end. Run by benches/bench.sh; prints one table.
//!
//! The anchor is PANDA, whose replays run under QEMU's TCG: its syscalls2
//! plugin alone made a command take 6.92 s instead of 1.55 s, 4.5x
//! (panda-re/panda#1167, 2022), on top of TCG's own slowdown.

// The tests' image builder.
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{path, provm, record_shell};

const RUNS: usize = 5;

/// A pipeline, a file written and read back, entropy and forks: many
/// system calls and processes to analyse.
const WORKLOAD: &str = "seq 1 2000 | sort -r | head -n 3; \
    dd if=/dev/zero of=/tmp/f bs=64k count=8 2>/dev/null; md5sum /tmp/f; \
    head -c 4096 /dev/urandom | md5sum; \
    for i in 1 2 3; do echo $i | cat | wc -c; done";

const CONFIGURATIONS: &[(&str, &[&str])] = &[
    ("plain replay", &[]),
    ("syscalls", &["--analyze", "syscalls"]),
    ("processes", &["--analyze", "processes"]),
    ("provenance", &["--analyze", "provenance"]),
    ("all three", &["--analyze", "syscalls,processes,provenance"]),
];

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("workload.provm");
    let recorded = record_shell(&common::images().tiny_qcow2, &trace, &[], WORKLOAD);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);

    let mut times = vec![Vec::new(); CONFIGURATIONS.len()];
    for round in 0..RUNS {
        for ((name, extra), times) in CONFIGURATIONS.iter().zip(&mut times) {
            let mut args = vec!["replay"];
            args.extend_from_slice(extra);
            args.push(path(&trace));
            let start = Instant::now();
            let replay = provm(&args);
            let took = start.elapsed();
            assert_eq!(
                replay.status, 0,
                "{name}: {}{}",
                replay.stdout, replay.stderr
            );
            assert!(
                replay.stdout.contains("replay matched"),
                "{name}: {}",
                replay.stdout
            );
            eprintln!("round {round}: {name}: {:.2} s", took.as_secs_f64());
            times.push(took);
        }
    }
    println!("replay with analyses against plain replay, {RUNS} replays each (seconds)");
    println!("| replay | median | min | max | median / plain |");
    println!("|---|---|---|---|---|");
    let plain = median(&mut times[0].clone());
    for ((name, _), times) in CONFIGURATIONS.iter().zip(&mut times) {
        let median = median(times);
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            median.as_secs_f64(),
            times[0].as_secs_f64(),
            times[times.len() - 1].as_secs_f64(),
            median.as_secs_f64() / plain.as_secs_f64()
        );
    }
    println!(
        "PANDA's syscalls2 plugin, for comparison: 6.92 s against 1.55 s without it, 4.46x \
         (panda-re/panda#1167), under TCG"
    );
}

/// Sorts `times` and returns their median.
fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}
