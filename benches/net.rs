//! What the guest's network costs: a 100 MB download from a host HTTP
//! server on 127.0.0.1 through the NAT (busybox wget, to /dev/null), as a
//! plain `provm run --net` and as `provm record --net`, five of each,
//! alternated so that a slow stretch of a shared host hits both alike.
//! Each is a whole run: restore the snapshot, download, power off; the
//! guest times the download itself too. Run by benches/bench.sh; prints
//! one table.

// The tests' image builder and file server.
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use provm_engine::record::RecordOptions;
use provm_engine::start::RunOptions;
use provm_guest_agent::Outcome;

const RUNS: usize = 5;
const MEGABYTES: usize = 100;

fn main() {
    let server = common::FileServer::serving(common::incompressible(MEGABYTES * 1_000_000));
    let script = format!("wget -q -O /dev/null {}", server.guest_url());
    let run = RunOptions {
        net: true,
        ..RunOptions::new(
            common::images().tiny_qcow2.clone(),
            vec!["/bin/sh".into(), "-c".into(), script.into()],
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let record = RecordOptions {
        run: run.clone(),
        output: dir.path().join("download.provm"),
        embed_image: false,
        exitless_limit: None,
        chaos: None,
        preempt: None,
        preempt_computations: false,
    };
    let timed = |recording: bool| {
        let start = Instant::now();
        let outcome = if recording {
            let _ = std::fs::remove_file(&record.output);
            provm_engine::record::record(&record, &mut [], &mut Vec::new(), &mut Vec::new())
                .unwrap()
                .outcome
        } else {
            provm_engine::run::run(&run, &mut [], &mut Vec::new(), &mut Vec::new())
                .unwrap()
                .outcome
        };
        assert_eq!(outcome, Outcome::Exited(0));
        let took = start.elapsed();
        eprintln!(
            "{}: {:.2} s",
            if recording { "record" } else { "run" },
            took.as_secs_f64()
        );
        took
    };
    // The first run boots the guest and caches its snapshot: not measured.
    timed(false);
    let (mut runs, mut records) = (Vec::new(), Vec::new());
    let mut trace_bytes = 0;
    for _ in 0..RUNS {
        runs.push(timed(false));
        records.push(timed(true));
        trace_bytes = std::fs::metadata(&record.output).unwrap().len();
    }
    server.stop();
    println!("{MEGABYTES} MB download through the NAT, {RUNS} whole runs each (seconds)");
    println!("| | median | min | max | MB/s (median) |");
    println!("|---|---|---|---|---|");
    let run_median = row("run --net", &mut runs);
    let record_median = row("record --net", &mut records);
    println!(
        "record / run: {:.2}; trace {} MiB",
        record_median.as_secs_f64() / run_median.as_secs_f64(),
        trace_bytes >> 20
    );
}

/// Prints median, min and max, and the median's throughput; returns the
/// median.
fn row(name: &str, times: &mut [Duration]) -> Duration {
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "| {name} | {:.1} | {:.1} | {:.1} | {:.2} |",
        median.as_secs_f64(),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64(),
        MEGABYTES as f64 / median.as_secs_f64()
    );
    median
}
