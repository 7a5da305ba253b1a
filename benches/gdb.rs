//! What time travel costs under `provm replay --gdb`: the snapshots the
//! replay takes as it goes (bytes, seconds each) and the latency of a
//! reverse-continue (restore the nearest earlier snapshot, re-execute to
//! the current point noting breakpoint hits, restore again, run to the
//! last hit) and of a reverse-stepi after two steps (restore, run to the
//! hit, step once). Five gdb sessions (Debian's gdb, `-batch`) on one
//! recording; each goes three quarters into the workload's output, stops
//! twice at a hardware breakpoint on `do_sys_openat2`, reverse-continues,
//! steps twice and reverse-steps (both timed in gdb's Python) and runs to
//! the end. Run by benches/bench.sh; prints one table.

// The tests' image builder and helpers.
#[path = "../tests/common/mod.rs"]
mod common;

use common::{
    agent_outputs, free_port, gdb_batch, log_events, path, provm, record_shell, serve_gdb,
};

const RUNS: usize = 5;

/// The analysis bench's workload: system calls, files and processes
/// enough for a log of several snapshot intervals.
const WORKLOAD: &str = "seq 1 2000 | sort -r | head -n 3; \
    dd if=/dev/zero of=/tmp/f bs=64k count=8 2>/dev/null; md5sum /tmp/f; \
    head -c 4096 /dev/urandom | md5sum; \
    for i in 1 2 3; do echo $i | cat | wc -c; cat /etc/marker > /tmp/m$i; done";

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("workload.provm");
    let recorded = record_shell(&common::images().tiny_qcow2, &trace, &[], WORKLOAD);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let vmlinux = dir.path().join("vmlinux");
    let extracted = provm(&[
        "replay",
        "--extract-kernel",
        "-o",
        path(&vmlinux),
        path(&trace),
    ]);
    assert_eq!(extracted.status, 0, "{}", extracted.stderr);
    let events = log_events(&trace);
    // Three quarters of the way through the workload's output, with opens
    // still to come (the log's last quarter is the command's end and the
    // power-off, where there are none).
    let outputs = agent_outputs(&trace);
    let (first, last) = (outputs[0], outputs[outputs.len() - 1]);
    let into_the_work = first + (last - first) * 3 / 4;

    let mut snapshot_bytes = Vec::new();
    let mut snapshot_seconds = Vec::new();
    let mut reverse_seconds = Vec::new();
    let mut reverse_step_seconds = Vec::new();
    for round in 0..RUNS {
        let address = format!("127.0.0.1:{}", free_port());
        let (mut served, stderr) = serve_gdb(&trace, &address, provm::gdb::SNAPSHOT_EVERY);
        let out = gdb_batch(
            &vmlinux,
            &address,
            &[
                &format!("monitor event {into_the_work}"),
                "hbreak do_sys_openat2",
                "continue",
                "continue",
                "python import time; started = time.monotonic()",
                "reverse-continue",
                "python print('reverse-continue took', time.monotonic() - started)",
                "stepi",
                "stepi",
                "python started = time.monotonic()",
                "reverse-stepi",
                "python print('reverse-stepi took', time.monotonic() - started)",
                "monitor snapshots",
                "delete",
                "continue",
            ],
        );
        let status = served.wait().unwrap();
        let stderr = stderr.join().unwrap();
        assert_eq!(status.code(), Some(0), "{out}\n{stderr}");
        let took = |what: &str| -> f64 {
            out.lines()
                .find_map(|line| line.strip_prefix(&format!("{what} took ")))
                .and_then(|seconds| seconds.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {what} time in: {out}"))
        };
        let (reverse, reverse_step) = (took("reverse-continue"), took("reverse-stepi"));
        assert_eq!(
            out.matches("Breakpoint 1, ").count(),
            3,
            "two hits and a reverse-continue to the first: {out}\n{stderr}"
        );
        for line in out.lines() {
            let Some(rest) = line.strip_prefix("snapshot ") else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            snapshot_bytes.push(fields[0].parse::<f64>().unwrap());
            snapshot_seconds.push(fields[2].parse::<f64>().unwrap());
        }
        eprintln!(
            "round {round}: reverse-continue {reverse:.3} s, reverse-stepi {reverse_step:.3} s"
        );
        reverse_seconds.push(reverse);
        reverse_step_seconds.push(reverse_step);
    }
    println!(
        "time travel under provm replay --gdb: {RUNS} sessions on one {events}-event recording, \
         a snapshot every {} events at first",
        provm::gdb::SNAPSHOT_EVERY
    );
    println!("| measure | median | min | max | samples |");
    println!("|---|---|---|---|---|");
    row(
        "snapshot size (MiB)",
        &mut snapshot_bytes,
        1.0 / (1 << 20) as f64,
    );
    row("snapshot time (s)", &mut snapshot_seconds, 1.0);
    row("reverse-continue latency (s)", &mut reverse_seconds, 1.0);
    row("reverse-stepi latency (s)", &mut reverse_step_seconds, 1.0);
}

/// One table row: median, min and max of `values` times `scale`.
fn row(name: &str, values: &mut [f64], scale: f64) {
    assert!(!values.is_empty(), "no samples of {name}");
    values.sort_by(f64::total_cmp);
    println!(
        "| {name} | {:.3} | {:.3} | {:.3} | {} |",
        values[values.len() / 2] * scale,
        values[0] * scale,
        values[values.len() - 1] * scale,
        values.len()
    );
}
