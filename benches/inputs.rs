//! What `--input` moves: of each size (1 MiB, 64 MiB and 1 GiB by
//! default), a folder of one file and a folder of 1 MiB files, recorded
//! with `sha256sum` of it in the guest and replayed, each whole run timed
//! from the survey of the input to power-off. MB/s is the input's size over
//! the run's time less the median of the same run with no input (what
//! starting and stopping the guest costs), so it is the transport's own
//! rate. Every run's input is new (its first byte is the run's number), so
//! each recording builds its input disk; the replay, on the recording's
//! host, finds it in the cache. The disks are removed from the cache at
//! the end. Run by benches/bench.sh; prints one table.
//!
//! PROVM_INPUT_MIB (comma-separated sizes), PROVM_INPUT_KINDS (`file`,
//! `folder` or both, the default) and PROVM_INPUT_RUNS (default 5) choose
//! less.

// The tests' image builder and incompressible data.
#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use provm_engine::record::RecordOptions;
use provm_engine::replay::{ReplayOptions, ReplayReport};
use provm_engine::start::RunOptions;
use provm_engine::transfer::Input;
use provm_guest_agent::Outcome;

/// The cache's input disks.
fn input_disks() -> BTreeSet<PathBuf> {
    let dir = provm_engine::kernel::cache_dir().join("inputs");
    std::fs::read_dir(dir)
        .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
        .unwrap_or_default()
}

fn main() {
    let sizes = env_list("PROVM_INPUT_MIB", &[1, 64, 1024]);
    let runs = env_list("PROVM_INPUT_RUNS", &[5])[0] as usize;
    let kinds = std::env::var("PROVM_INPUT_KINDS").unwrap_or_else(|_| "file,folder".into());
    let dir = tempfile::tempdir().unwrap();
    let disks_before = input_disks();
    // The first recording boots the guest and caches its snapshot: not measured.
    record_and_replay(dir.path(), None);
    let (mut bare_records, mut bare_replays) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (record, replay) = record_and_replay(dir.path(), None);
        bare_records.push(record);
        bare_replays.push(replay);
    }
    let bare = (median(&mut bare_records), median(&mut bare_replays));
    println!("--input, sha256sum in the guest, {runs} runs each (seconds; MB/s over the run less the no-input run's median: record {:.1} s, replay {:.1} s)", bare.0.as_secs_f64(), bare.1.as_secs_f64());
    println!("| input | record median | min | max | MB/s | replay median | min | max | MB/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for kind in kinds.split(',') {
        let files_mib = match kind {
            "file" => None,
            "folder" => Some(1),
            other => panic!("PROVM_INPUT_KINDS: {other} is neither file nor folder"),
        };
        for &mib in &sizes {
            let (mut records, mut replays) = (Vec::new(), Vec::new());
            for run in 0..runs {
                let input = Some((mib, files_mib.unwrap_or(mib), run as u8));
                let (record, replay) = record_and_replay(dir.path(), input);
                records.push(record);
                replays.push(replay);
            }
            println!(
                "| {mib} MiB ({kind}) |{}|{}|",
                cells(mib, &mut records, bare.0),
                cells(mib, &mut replays, bare.1)
            );
        }
    }
    for disk in input_disks().difference(&disks_before) {
        std::fs::remove_file(disk).unwrap();
    }
}

/// A recording of `sha256sum` over an input (none: no input) of `mib` MiB
/// in files of `file_mib`, its first byte `run`, and its replay, timed.
fn record_and_replay(dir: &Path, input: Option<(u64, u64, u8)>) -> (Duration, Duration) {
    let mut run = RunOptions::new(
        common::images().tiny_qcow2.clone(),
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "sha256sum /data/* > /dev/null || :".into(),
        ],
    );
    if let Some((mib, file_mib, number)) = input {
        let folder = dir.join("input");
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir(&folder).unwrap();
        let mut bytes = common::incompressible((mib << 20) as usize);
        bytes[0] = number;
        for (index, file) in bytes.chunks((file_mib << 20) as usize).enumerate() {
            std::fs::write(folder.join(format!("{index:04}.bin")), file).unwrap();
        }
        run.inputs = vec![Input::parse(&format!("{}:/data", folder.display())).unwrap()];
        // Inputs of DISK_FROM bytes or more go by disk, not in guest
        // memory: the guest (and its booted snapshot) keeps its size.
        assert!(mib << 20 >= provm_engine::transfer::DISK_FROM);
    }
    let record = RecordOptions {
        run,
        output: dir.join("input.provm"),
        embed_image: false,
        exitless_limit: None,
        chaos: None,
        preempt: None,
        preempt_computations: false,
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
        "{:?}: record {:.2} s, replay {:.2} s",
        input,
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
