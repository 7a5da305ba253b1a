//! `provm query` and `provm export` on a long run's trace: at least a
//! million events. A run that long takes most of an hour to record where
//! guest ring 0 is emulated, so the long trace is made from a real one:
//! one recording (with --prov) of a busy workload, whose event log is
//! written again and again into a new trace, each copy's clock readings
//! moved on by the recording's span, with the recording's manifest, kernel,
//! snapshot and provenance (the trace verifies like any other; only its
//! outcome's counts are the new log's). Prints one table: the time of each
//! command and the sizes of the trace and of run.db.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use provm_trace::event_log::EventLogWriter;
use provm_trace::events::Event;
use provm_trace::format::{SectionKind, SectionWriter, TraceReader};
use provm_trace::reader::Trace;

const MIN_EVENTS: u64 = 1_000_000;
const WORKLOAD: &str =
    "for i in $(seq 200); do echo $i >> /tmp/log; done; sort -n /tmp/log | tail -n 1";

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let recorded = dir.path().join("recorded.provm");
    let finished = common::record_shell(
        &common::images().tiny_qcow2,
        &recorded,
        &["--prov", common::path(&dir.path().join("run.prov"))],
        WORKLOAD,
    );
    assert_eq!(finished.status, 0, "{}", finished.stderr);
    // Kept for people to query (target-artifacts/ is not committed).
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("target-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let long = artifacts.join("query-bench.provm");
    let events = lengthen(&recorded, &long);

    println!("| command on a {events}-event trace | seconds |");
    println!("|---|---|");
    let trace = common::path(&long);
    let db = dir.path().join("run.db");
    let json = dir.path().join("run.json");
    for (what, args) in [
        ("inspect", vec!["inspect", trace]),
        (
            "query: the manifest only (the log is not loaded)",
            vec!["query", trace, "SELECT events, exits FROM manifest"],
        ),
        (
            "query: events by kind",
            vec![
                "query",
                trace,
                "SELECT kind, count(*) FROM events GROUP BY kind",
            ],
        ),
        (
            "query: exits by device and place",
            vec![
                "query",
                trace,
                "SELECT device, count(*), count(DISTINCT rip) FROM exits GROUP BY device",
            ],
        ),
        (
            "query: interrupts per guest-second (top 5)",
            vec![
                "query",
                trace,
                "SELECT guest_ns / 1000000000 AS s, count(*) AS n FROM events \
                 WHERE kind = 'interrupt injection' GROUP BY s ORDER BY n DESC LIMIT 5",
            ],
        ),
        (
            "query: the events of one exit",
            vec!["query", trace, "SELECT * FROM events WHERE exit = 123456"],
        ),
        (
            "export sqlite",
            vec!["export", "sqlite", trace, "-o", common::path(&db)],
        ),
        (
            "export timeline",
            vec!["export", "timeline", trace, "-o", common::path(&json)],
        ),
    ] {
        println!("| {what} | {:.2} |", time(&args));
    }
    let size = |path: &Path| std::fs::metadata(path).unwrap().len();
    let log_bytes = Trace::open(&long).unwrap().stored_bytes[&SectionKind::Events];
    println!();
    println!(
        "trace {} bytes (event log {log_bytes}), run.db {} bytes ({:.1} x the trace), run.json {} bytes",
        size(&long),
        size(&db),
        size(&db) as f64 / size(&long) as f64,
        size(&json)
    );
}

/// Seconds `provm ARGS` took; it must succeed.
fn time(args: &[&str]) -> f64 {
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "provm {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    start.elapsed().as_secs_f64()
}

/// Writes `long`: `recorded` with its event log repeated until it holds
/// at least MIN_EVENTS events. Returns how many it holds.
fn lengthen(recorded: &Path, long: &Path) -> u64 {
    let original = Trace::open(recorded).unwrap();
    let mut log = Vec::new();
    let mut events = original.events().unwrap();
    while let Some(event) = events.next_event().unwrap() {
        log.push(event);
    }
    let clocks = || {
        log.iter().filter_map(|event| match event {
            Event::Clock(ns) => Some(*ns),
            _ => None,
        })
    };
    let first_ns = clocks().next().unwrap_or(0);
    let span_ns = clocks().next_back().unwrap_or(0) - first_ns + 1;

    // The sections before the log, as recorded.
    let mut writer = SectionWriter::create(long).unwrap();
    let mut reader = TraceReader::open(recorded).unwrap();
    while let Some(section) = reader.next_section().unwrap() {
        if matches!(section.kind, SectionKind::Events | SectionKind::Outcome) {
            break;
        }
        writer.section(section.kind, &section.payload).unwrap();
    }
    let mut appender = EventLogWriter::new(writer, first_ns);
    let mut copies = 0u64;
    while copies * (log.len() as u64) < MIN_EVENTS {
        for event in &log {
            let event = match event {
                Event::Clock(ns) => Event::Clock(ns + copies * span_ns),
                other => other.clone(),
            };
            appender.append(&event).unwrap();
        }
        copies += 1;
    }
    let (writer, totals) = appender.finish().unwrap();
    let mut writer = writer.expect("a log written into a trace gives its writer back");
    let mut outcome = original.outcome.clone();
    (outcome.events, outcome.exits, outcome.event_chunks) =
        (totals.events, totals.exits, totals.chunks);
    outcome.guest_ns = totals.last_clock_ns - first_ns;
    writer
        .section(SectionKind::Outcome, &serde_json::to_vec(&outcome).unwrap())
        .unwrap();
    writer
        .section(
            SectionKind::Provenance,
            original.provenance.as_ref().unwrap(),
        )
        .unwrap();
    writer.finish().unwrap();
    totals.events
}
