//! What pinning costs: the same workload as a plain `provm run` and as a
//! pinned one (`--pinned`), five of each, alternated so that a slow
//! stretch of a shared host hits both alike. Each is a whole run: restore
//! the snapshot, run the command, power off. Run by benches/bench.sh;
//! prints one table.

// The tests' image builder.
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use provm_engine::pinning::Pinning;
use provm_engine::start::RunOptions;
use provm_guest_agent::Outcome;

const RUNS: usize = 5;

fn main() {
    let plain = RunOptions::new(
        common::images().tiny_qcow2.clone(),
        vec!["/bin/sh".into(), "-c".into(), common::BENCH_WORKLOAD.into()],
    );
    let pinned = RunOptions {
        pinned: Some(Pinning::default()),
        ..plain.clone()
    };
    let timed = |options: &RunOptions| {
        let start = Instant::now();
        let ran =
            provm_engine::run::run(options, &mut [], &mut Vec::new(), &mut Vec::new()).unwrap();
        assert_eq!(ran.outcome, Outcome::Exited(0));
        let took = start.elapsed();
        let kind = if options.pinned.is_some() {
            "pinned"
        } else {
            "plain"
        };
        eprintln!("{kind} run: {:.2} s", took.as_secs_f64());
        took
    };
    // The first run boots the guest and caches its snapshot: not measured.
    timed(&plain);
    let (mut plain_times, mut pinned_times) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        plain_times.push(timed(&plain));
        pinned_times.push(timed(&pinned));
    }
    println!("pinned run against plain run, {RUNS} whole runs each (seconds)");
    println!("           median     min     max");
    let plain_median = row("plain", &mut plain_times);
    let pinned_median = row("pinned", &mut pinned_times);
    println!(
        "ratio      {:.2} (pinned median / plain median)",
        pinned_median.as_secs_f64() / plain_median.as_secs_f64()
    );
}

/// Prints median, min and max; returns the median.
fn row(name: &str, times: &mut [Duration]) -> Duration {
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "{name:<8} {:>8.2} {:>7.2} {:>7.2}",
        median.as_secs_f64(),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
    median
}
