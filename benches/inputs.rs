//! What `--input` moves: a folder of one file of each size (1 MiB, 64 MiB
//! and 1 GiB by default), recorded with `sha256sum` of it in the guest and
//! replayed, each whole run timed from the snapshot's restore to power-off.
//! MB/s is the input's size over the run's time less the median of the same
//! run with no input (what starting and stopping the guest costs), so it is
//! the transport's own rate. Run by benches/bench.sh; prints one table.
//!
//! PROVM_INPUT_MIB (comma-separated sizes) and PROVM_INPUT_RUNS (default 5)
//! choose less: through the agent channel a 64 MiB input takes most of an
//! hour on PVM, and a 1 GiB one half a day.

// The tests' image builder and incompressible data.
#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use provm_engine::record::RecordOptions;
use provm_engine::replay::{ReplayOptions, ReplayReport};
use provm_engine::run::RunOptions;
use provm_engine::transfer::Input;
use provm_guest_agent::Outcome;

fn main() {
    let sizes = env_list("PROVM_INPUT_MIB", &[1, 64, 1024]);
    let runs = env_list("PROVM_INPUT_RUNS", &[5])[0] as usize;
    let dir = tempfile::tempdir().unwrap();
    // The first recording boots the guest and caches its snapshot: not measured.
    record_and_replay(dir.path(), None);
    let (mut bare_records, mut bare_replays) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (record, replay) = record_and_replay(dir.path(), None);
        bare_records.push(record);
        bare_replays.push(replay);
    }
    let bare = (median(&mut bare_records), median(&mut bare_replays));
    println!("--input of one file, sha256sum in the guest, {runs} runs each (seconds; MB/s over the run less the no-input run's median: record {:.1} s, replay {:.1} s)", bare.0.as_secs_f64(), bare.1.as_secs_f64());
    println!("| input | record median | min | max | MB/s | replay median | min | max | MB/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for mib in sizes {
        let (mut records, mut replays) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let (record, replay) = record_and_replay(dir.path(), Some(mib));
            records.push(record);
            replays.push(replay);
        }
        println!(
            "| {mib} MiB |{}|{}|",
            cells(mib, &mut records, bare.0),
            cells(mib, &mut replays, bare.1)
        );
    }
}

/// A recording of `sha256sum` over an input of `mib` MiB (none: no input)
/// and its replay, timed.
fn record_and_replay(dir: &Path, mib: Option<u64>) -> (Duration, Duration) {
    let mut run = RunOptions::new(
        common::images().tiny_qcow2.clone(),
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "sha256sum /data/* || :".into(),
        ],
    );
    if let Some(mib) = mib {
        let folder = dir.join(format!("input-{mib}"));
        if !folder.exists() {
            std::fs::create_dir(&folder).unwrap();
            let bytes = common::incompressible((mib << 20) as usize);
            std::fs::write(folder.join("data.bin"), bytes).unwrap();
        }
        run.inputs = vec![Input::parse(&format!("{}:/data", folder.display())).unwrap()];
        // The channel keeps inputs in guest memory, at most half of it.
        run.memory_mib = run.memory_mib.max(2 * mib + 128);
    }
    let record = RecordOptions {
        run,
        output: dir.join("input.provm"),
        embed_image: false,
        exitless_limit: None,
        chaos: None,
    };
    let _ = std::fs::remove_file(&record.output);
    let start = Instant::now();
    let recorded =
        provm_engine::record::record(&record, &mut [], &mut Vec::new(), &mut Vec::new()).unwrap();
    let recorded_in = start.elapsed();
    assert_eq!(recorded.outcome, Outcome::Exited(0));
    let start = Instant::now();
    let (report, _) =
        provm_engine::replay::replay(&ReplayOptions::for_analysis(record.output.clone()), vec![])
            .unwrap();
    let replayed_in = start.elapsed();
    assert!(
        matches!(report, ReplayReport::Matched { .. }),
        "{}",
        report.summary()
    );
    eprintln!(
        "{} MiB: record {:.2} s, replay {:.2} s",
        mib.unwrap_or(0),
        recorded_in.as_secs_f64(),
        replayed_in.as_secs_f64()
    );
    (recorded_in, replayed_in)
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The median, min and max of `times`, and the rate of `mib` MiB over the
/// median less `bare`.
fn cells(mib: u64, times: &mut [Duration], bare: Duration) -> String {
    let median = median(times);
    let moving = median.saturating_sub(bare).as_secs_f64();
    format!(
        " {:.1} | {:.1} | {:.1} | {:.3} ",
        median.as_secs_f64(),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64(),
        (mib << 20) as f64 / 1e6 / moving
    )
}

/// The comma-separated numbers in the environment variable `name`, else
/// `default`.
fn env_list(name: &str, default: &[u64]) -> Vec<u64> {
    match std::env::var(name) {
        Ok(value) => value
            .split(',')
            .map(|item| {
                item.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={value}: not numbers"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}
