//! What a what-if fork costs: the time a fork takes to reach its fork
//! point (replaying the recording up to there, and logging it into the
//! fork's trace) against a plain replay of the whole recording, for fork
//! points half-way and at the last event; and each whole fork. Five of
//! each, alternated so that a slow stretch of a shared host hits all
//! alike; whole `provm replay` commands. Run by benches/bench.sh; prints
//! one table.

// The tests' image builder.
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{path, provm, record_shell};

const RUNS: usize = 5;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("workload.provm");
    let recorded = record_shell(
        &common::images().tiny_qcow2,
        &trace,
        &["--pinned"],
        common::BENCH_WORKLOAD,
    );
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let events = provm_trace::reader::Trace::open(&trace)
        .unwrap()
        .outcome
        .events;
    let points = [("half-way", events / 2), ("the last event", events - 1)];
    let fork_out = dir.path().join("fork.provm");

    let mut replays = Vec::new();
    let mut reach = vec![Vec::new(); points.len()];
    let mut whole = vec![Vec::new(); points.len()];
    for round in 0..RUNS {
        let start = Instant::now();
        let replay = provm(&["replay", path(&trace)]);
        assert_eq!(replay.status, 0, "{}{}", replay.stdout, replay.stderr);
        replays.push(start.elapsed());
        eprintln!(
            "round {round}: replay {:.2} s",
            start.elapsed().as_secs_f64()
        );
        for (index, (name, at)) in points.iter().enumerate() {
            let at = at.to_string();
            let start = Instant::now();
            let forked = provm(&[
                "replay",
                path(&trace),
                "--fork-at",
                &at,
                "--inject",
                "none",
                "--force",
                "-o",
                path(&fork_out),
            ]);
            let took = start.elapsed();
            assert_eq!(forked.status, 0, "{}{}", forked.stdout, forked.stderr);
            assert!(
                forked.stdout.contains("verdict: identical"),
                "{}",
                forked.stdout
            );
            let reached = reached_after(&forked.stderr);
            eprintln!(
                "round {round}: fork at {name}: reached in {:.2} s, whole {:.2} s",
                reached.as_secs_f64(),
                took.as_secs_f64()
            );
            reach[index].push(reached);
            whole[index].push(took);
        }
    }
    println!("a fork against a plain replay, {RUNS} of each, {events} events (seconds)");
    println!("| | median | min | max |");
    println!("|---|---|---|---|");
    row("plain replay, whole trace", &mut replays);
    for (index, (name, at)) in points.iter().enumerate() {
        row(
            &format!("fork at {name} (event {at}): reaching it"),
            &mut reach[index],
        );
        row(&format!("fork at {name}: whole fork"), &mut whole[index]);
    }
}

/// The time to the fork point that provm printed on stderr.
fn reached_after(stderr: &str) -> Duration {
    let seconds = stderr
        .lines()
        .find_map(|line| line.strip_prefix("provm: reached the fork point"))
        .and_then(|rest| rest.split(" in ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no fork point in: {stderr}"));
    Duration::from_secs_f64(seconds.parse().unwrap())
}

fn row(name: &str, times: &mut [Duration]) {
    times.sort();
    println!(
        "| {name} | {:.2} | {:.2} | {:.2} |",
        times[times.len() / 2].as_secs_f64(),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
}
