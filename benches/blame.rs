//! Hypervisor blame: what capturing exit timing costs a recording (five
//! recordings with it and five without, alternated so that a slow stretch
//! of a shared host hits both alike), the validation sweep (an injected
//! virtio-blk delay against the blame it adds), and a what-if replay's
//! prediction against its measurement. The workload writes 128 blocks of
//! 4 KiB with O_DIRECT: each is a virtio-blk request. Run by
//! benches/bench.sh; prints three tables.

// The tests' image builder.
#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use provm::blame::{compare, inject};
use provm_engine::record::RecordOptions;
use provm_engine::start::RunOptions;
use provm_engine::timing::{TimingObserver, TimingReport};
use provm_guest_agent::Outcome;
use provm_vmm::exit_timing::ExitDelay;

const RUNS: usize = 5;
const WORKLOAD: &str = "dd if=/dev/zero of=/data/f bs=4k count=128 oflag=direct";
const DISK: &str = "virtio-blk";

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunOptions::new(
        common::images().tiny_qcow2.clone(),
        vec!["/bin/sh".into(), "-c".into(), WORKLOAD.into()],
    );
    capture_cost(&run, dir.path());
    println!();
    sweep(&run);
    println!();
    what_if(&dir.path().join("timed-0.provm"));
}

/// A recording of the workload, and how long it took.
fn record(run: &RunOptions, output: &Path, timing: bool) -> Duration {
    let options = RecordOptions {
        run: run.clone(),
        output: output.to_owned(),
        embed_image: false,
        exitless_limit: None,
        chaos: None,
        preempt: None,
        preempt_computations: false,
    };
    let mut timing = TimingObserver::new("record", timing, None);
    let start = Instant::now();
    let recorded = provm_engine::record::record(
        &options,
        &mut [&mut timing],
        &mut Vec::new(),
        &mut Vec::new(),
    )
    .unwrap();
    assert_eq!(recorded.outcome, Outcome::Exited(0));
    start.elapsed()
}

fn capture_cost(run: &RunOptions, dir: &Path) {
    // The first boots the guest and caches its snapshot: not measured.
    record(run, &dir.join("warm.provm"), false);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut per_exit = Vec::new();
    for index in 0..RUNS {
        let trace = dir.join(format!("timed-{index}.provm"));
        with.push(record(run, &trace, true));
        let report = provm::blame::load(&trace).unwrap();
        per_exit.push(report.capture_ns as f64 / report.total().exits as f64);
        without.push(record(run, &dir.join("untimed.provm"), false));
        std::fs::remove_file(dir.join("untimed.provm")).unwrap();
        eprintln!(
            "record with timing {:.2} s, without {:.2} s",
            with[index].as_secs_f64(),
            without[index].as_secs_f64()
        );
    }
    println!("recording with exit timing against without, {RUNS} recordings each (seconds)");
    println!("| recording | median | min | max |");
    println!("|---|---|---|---|");
    let with_median = row("with timing", &mut with);
    let without_median = row("without", &mut without);
    per_exit.sort_by(f64::total_cmp);
    println!(
        "ratio {:.3} (median with / median without); the observer's own time per exit: median {:.0} ns (min {:.0}, max {:.0})",
        with_median.as_secs_f64() / without_median.as_secs_f64(),
        per_exit[RUNS / 2],
        per_exit[0],
        per_exit[RUNS - 1]
    );
}

/// Prints a table row of median, min and max; returns the median.
fn row(name: &str, times: &mut [Duration]) -> Duration {
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "| {name} | {:.2} | {:.2} | {:.2} |",
        median.as_secs_f64(),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64()
    );
    median
}

/// A run of the workload with `delay` injected, its exits timed.
fn timed_run(run: &RunOptions, delay: Option<ExitDelay>) -> TimingReport {
    let mut timing = TimingObserver::new("run", true, delay);
    let ran =
        provm_engine::run::run(run, &mut [&mut timing], &mut Vec::new(), &mut Vec::new()).unwrap();
    assert_eq!(ran.outcome, Outcome::Exited(0));
    timing.report().expect("timing was captured")
}

fn disk_blame(report: &TimingReport) -> (u64, f64) {
    let disk = report.by_device().remove(DISK).unwrap_or_default();
    (disk.exits, disk.hypervisor_ns() as f64)
}

fn sweep(run: &RunOptions) {
    let zero: Vec<(u64, f64)> = (0..2).map(|_| disk_blame(&timed_run(run, None))).collect();
    let base = (zero[0].1 + zero[1].1) / 2.0;
    println!("validation sweep: virtio-blk exits delayed, its blame against delay x exits (ms)");
    println!("| injected delay | exits | expected | measured | measured / expected |");
    println!("|---|---|---|---|---|");
    let mut points: Vec<(f64, f64)> = zero.iter().map(|z| (0.0, z.1 - base)).collect();
    for (exits, blame) in &zero {
        println!("| 0 | {exits} | 0 | {:+.3} | - |", (blame - base) / 1e6);
    }
    for us in [200u64, 500, 1000, 2000] {
        let delay = inject::parse_exit_delay(&format!("{DISK}:{us}us")).unwrap();
        let (exits, blame) = disk_blame(&timed_run(run, Some(delay)));
        let expected = (us * 1000 * exits) as f64;
        let measured = blame - base;
        println!(
            "| {us} us | {exits} | {:.3} | {:.3} | {:.4} |",
            expected / 1e6,
            measured / 1e6,
            measured / expected
        );
        points.push((expected, measured));
    }
    println!(
        "fitted slope (least squares, measured over expected): {:.4}",
        common::slope(&points)
    );
}

fn what_if(trace: &Path) {
    for change in ["virtio-blk=+2ms", "virtio-blk=x2"] {
        let delay = inject::parse_what_if(change).unwrap();
        let predictions = compare::what_if(trace, &delay, Duration::from_secs(3600)).unwrap();
        compare::write_what_if(&delay, &predictions, &mut std::io::stdout()).unwrap();
        println!();
    }
}
