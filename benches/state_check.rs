//! What state checks cost: `provm record` and `provm replay` of the same
//! workloads with state checks (provm's default) and without (the
//! internal switch PROVM_STATE_CHECKS=off), five of each, alternated so
//! that a slow stretch of a shared host hits all alike; whole commands.
//! Also the time one memory digest takes at the default memory size. Run
//! by benches/bench.sh; prints one table.

// The tests' image builder and workloads.
#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{path, provm, provm_with_env, Finished};
use provm_trace::events::EventKind;
use provm_trace::format::SectionKind;
use provm_trace::reader::Trace;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

const RUNS: usize = 5;
/// The default guest memory (`provm record --memory`), MiB.
const MEMORY_MIB: u64 = 128;

/// Workloads: the benches' shell mix, and a longer one with tens of
/// thousands of timer ticks, which takes periodic memory checks.
const WORKLOADS: &[(&str, &str)] = &[
    ("shell mix", common::BENCH_WORKLOAD),
    (
        "compute and sleep, 4 s",
        "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; sleep 2; \
         seq 1 20000 | sort -r | md5sum",
    ),
];

fn main() {
    // A memory digest of RAM the guest never touched (zeros, most of a
    // small guest's) and of RAM it wrote all of.
    let ram = provm_vmm::memory::create(MEMORY_MIB).unwrap();
    let of_zeros = digest_times(&ram);
    ram.write_slice(
        &pseudo_random(ram.last_addr().0 as usize + 1),
        GuestAddress(0),
    )
    .unwrap();
    let of_written = digest_times(&ram);
    let dir = tempfile::tempdir().unwrap();
    // The first run boots the guest and caches its snapshot.
    let warm = record(&dir.path().join("warm.provm"), "true", true);
    assert_eq!(warm.status, 0, "{}", warm.stderr);

    println!("state checks on and off, {RUNS} of each (seconds: median, min, max)");
    println!(
        "| workload | events | state checks | page digests, bytes | record, checks off | record, checks on | record cost \
         | replay, checks off | replay, checks on | replay cost |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (workload, (name, script)) in WORKLOADS.iter().enumerate() {
        let mut times = [(); 4].map(|_| Vec::new());
        let mut counts = (0, 0, 0);
        for round in 0..RUNS {
            for (checked, slot) in [(false, 0), (true, 1)] {
                let trace = dir
                    .path()
                    .join(format!("{workload}-{round}-{checked}.provm"));
                let start = Instant::now();
                let recorded = record(&trace, script, checked);
                times[slot].push(start.elapsed());
                assert_eq!(recorded.status, 0, "{name}: {}", recorded.stderr);
                let start = Instant::now();
                let replay = provm(&["replay", path(&trace)]);
                times[slot + 2].push(start.elapsed());
                assert_eq!(
                    replay.status, 0,
                    "{name}: {}{}",
                    replay.stdout, replay.stderr
                );
                if checked {
                    counts = checks(&trace);
                }
                eprintln!(
                    "{name}: round {round}, checks {}: record {:.2} s, replay {:.2} s",
                    if checked { "on" } else { "off" },
                    times[slot][round].as_secs_f64(),
                    times[slot + 2][round].as_secs_f64(),
                );
            }
        }
        let [record_off, record_on, replay_off, replay_on] = times.map(stats);
        let cost = |off: (f64, f64, f64), on: (f64, f64, f64)| {
            format!("{:+.1}%", (on.0 / off.0 - 1.0) * 100.0)
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            counts.0,
            counts.1,
            counts.2,
            cell(record_off),
            cell(record_on),
            cost(record_off, record_on),
            cell(replay_off),
            cell(replay_on),
            cost(replay_off, replay_on),
        );
    }
    let ms = |times| {
        let (median, min, max) = stats(times);
        format!(
            "median {:.1} ms, min {:.1}, max {:.1}",
            median * 1e3,
            min * 1e3,
            max * 1e3
        )
    };
    println!();
    println!(
        "One memory digest of {MEMORY_MIB} MiB (xxh3-64 over all guest RAM, and 16 bits for \
         each 256 bytes, the page digests): of zeros {}; of RAM written all over {}. \
         State checks: memory every {} events, \
         and memory, registers and devices at the guest's power-off. Times are whole \
         commands, the guest restored from its cached snapshot.",
        ms(of_zeros),
        ms(of_written),
        provm_seams::state_check::MEMORY_CHECK_EVENTS,
    );
}

/// `RUNS` timings of one memory digest of `ram`.
fn digest_times(ram: &provm_vmm::memory::GuestMemory) -> Vec<Duration> {
    (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(provm_vmm::state_digest::memory(ram));
            start.elapsed()
        })
        .collect()
}

/// `len` bytes of a xorshift sequence: no block of them is zeros.
fn pseudo_random(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..len / 8)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .collect()
}

fn record(trace: &Path, script: &str, checked: bool) -> Finished {
    let image = &common::images().tiny_qcow2;
    let args = [
        "record",
        "-o",
        path(trace),
        path(image),
        "--",
        "/bin/sh",
        "-c",
        script,
    ];
    let env: &[(&str, &Path)] = if checked {
        &[]
    } else {
        &[("PROVM_STATE_CHECKS", Path::new("off"))]
    };
    provm_with_env(&args, env)
}

/// The trace's events, its state checks (periodic and final), and the
/// bytes their page digests take in it.
fn checks(trace: &Path) -> (u64, u64, u64) {
    let trace = Trace::open(trace).unwrap();
    let periodic = trace
        .count_events()
        .unwrap()
        .get(&EventKind::StateCheck)
        .copied();
    let final_check = u64::from(trace.outcome.state_check.is_some());
    let pages = trace.stored_bytes.get(&SectionKind::PageDigests).copied();
    (
        trace.outcome.events,
        periodic.unwrap_or(0) + final_check,
        pages.unwrap_or(0),
    )
}

/// Median, min and max, in seconds.
fn stats(mut times: Vec<Duration>) -> (f64, f64, f64) {
    times.sort();
    let seconds = |d: Duration| d.as_secs_f64();
    (
        seconds(times[times.len() / 2]),
        seconds(times[0]),
        seconds(times[times.len() - 1]),
    )
}

fn cell((median, min, max): (f64, f64, f64)) -> String {
    format!("{median:.2} ({min:.2}-{max:.2})")
}
