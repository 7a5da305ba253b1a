//! End-to-end `provm query` and `provm export` on real recordings: one run
//! of the provenance tests' pipeline recorded with `--prov`, and one
//! without provenance, and one without exit timing, shared by every test of
//! this binary, `parquet.rs`'s and `diff.rs`'s too (the first record boots the guest; the
//! others start from its snapshot).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{digest, images, one_guest_at_a_time, path, provm, record_shell, PROVM_FAILED};
use serde_json::{json, Value};

/// The provenance tests' pipeline, each program started by a shell of its
/// own so that it is exec'd and its arguments are recorded (busybox's shell
/// runs an applet it forks without an exec).
const PIPELINE: &str = "sh -c 'sort in.txt' > mid.txt; sh -c 'wc -l mid.txt' > out.txt";

pub(crate) struct Recorded {
    /// Recorded with --prov.
    pub pipeline: PathBuf,
    /// Recorded without.
    pub plain: PathBuf,
    /// Recorded with --no-timing.
    pub untimed: PathBuf,
}

pub(crate) fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let _guest = one_guest_at_a_time();
        let dir = &common::scratch(module_path!());
        let record = |name: &str, extra: &[&str], script: &str| {
            let trace = dir.join(format!("{name}.provm"));
            let finished = record_shell(&images().tiny_qcow2, &trace, extra, script);
            assert_eq!(finished.status, 0, "{name}: {}", finished.stderr);
            trace
        };
        let document = dir.join("pipeline.prov");
        Recorded {
            pipeline: record(
                "pipeline",
                &["--prov", path(&document), "--cwd", "/data"],
                PIPELINE,
            ),
            plain: record("plain", &[], "echo plain"),
            untimed: record("untimed", &["--no-timing"], "echo untimed"),
        }
    })
}

/// `provm ARGS` that must succeed; its standard output.
fn succeeds(args: &[&str]) -> String {
    let finished = provm(args);
    assert_eq!(finished.status, 0, "provm {args:?}: {}", finished.stderr);
    finished.stdout
}

/// `provm query --format json TRACES... SQL`, parsed.
pub(crate) fn query_json(traces: &[&Path], sql: &str) -> Vec<Value> {
    let mut args = vec!["query", "--format", "json"];
    args.extend(traces.iter().map(|trace| path(trace)));
    args.push(sql);
    let rows: Value = serde_json::from_str(&succeeds(&args)).expect("query's JSON parses");
    rows.as_array().expect("an array of rows").clone()
}

/// `provm blame --format json TRACE`, parsed.
fn blame_json(trace: &Path) -> Value {
    serde_json::from_str(&succeeds(&["blame", "--format", "json", path(trace)]))
        .expect("blame's JSON parses")
}

/// The event counts by kind that `provm inspect` prints, and its total.
fn inspect_counts(trace: &Path) -> (u64, BTreeMap<String, u64>) {
    let text = succeeds(&["inspect", path(trace)]);
    let mut lines = text.lines().skip_while(|line| !line.starts_with("events "));
    let total = lines.next().expect("inspect prints the events")["events".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let counts = lines
        .take_while(|line| line.starts_with("  "))
        .map(|line| {
            let (kind, count) = line.trim().rsplit_once(' ').unwrap();
            (kind.trim().to_owned(), count.parse().unwrap())
        })
        .collect();
    (total, counts)
}

#[test]
fn queries_see_the_log_and_the_provenance() {
    let trace = &recorded().pipeline;
    let (total, by_kind) = inspect_counts(trace);
    let counted = query_json(
        &[trace],
        "SELECT kind, count(*) AS n FROM events GROUP BY kind",
    );
    let counted: BTreeMap<String, u64> = counted
        .iter()
        .map(|row| {
            (
                row["kind"].as_str().unwrap().into(),
                row["n"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counted, by_kind);
    assert_eq!(counted.values().sum::<u64>(), total);

    let manifest = &query_json(&[trace], "SELECT * FROM manifest")[0];
    assert_eq!(manifest["events"].as_u64(), Some(total));
    assert_eq!(manifest["has_provenance"], 1);
    assert_eq!(manifest["cwd"], "/data");
    let exits = &query_json(
        &[trace],
        "SELECT count(*) AS n, max(exit) AS last FROM exits",
    )[0];
    assert_eq!(exits["n"], manifest["exits"]);
    assert_eq!(
        exits["last"].as_u64(),
        Some(manifest["exits"].as_u64().unwrap() - 1)
    );

    // What sort wrote, through the graph: processes, edges and files joined.
    let generated = query_json(
        &[trace],
        "SELECT p.command, f.name FROM edges e \
         JOIN processes p ON p.id = e.target AND p.run = e.run \
         JOIN files f ON f.id = e.source AND f.run = e.run \
         WHERE e.relation = 'wasGeneratedBy' ORDER BY f.name",
    );
    let generated: Vec<(&str, &str)> = generated
        .iter()
        .map(|row| {
            (
                row["command"].as_str().unwrap(),
                row["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        generated,
        [
            // busybox's shell runs the applet it was given last itself.
            ("sh -c sort in.txt", "/data/mid.txt"),
            ("wc -l mid.txt", "/data/out.txt")
        ]
    );

    // Every port exit has a device, and the guest used the console's.
    let devices = query_json(
        &[trace],
        "SELECT DISTINCT device FROM exits WHERE kind LIKE 'port%' OR kind LIKE 'MMIO%'",
    );
    let devices: Vec<&str> = devices
        .iter()
        .map(|row| row["device"].as_str().unwrap())
        .collect();
    for device in ["pic", "virtio-console", "clock"] {
        assert!(devices.contains(&device), "{device} not in {devices:?}");
    }

    // The aligned table and CSV say the same.
    let sql = "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind";
    let table = succeeds(&["query", path(trace), sql]);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("kind"), "{table}");
    assert!(lines.next().unwrap().starts_with("----"), "{table}");
    let csv = succeeds(&["query", "--format", "csv", path(trace), sql]);
    assert_eq!(csv.lines().count(), table.lines().count() - 1, "{csv}");
    assert!(
        csv.contains(&format!("clock,{}", by_kind["clock"])),
        "{csv}"
    );
}

#[test]
fn several_runs_are_told_apart_by_their_run_column() {
    let Recorded {
        pipeline, plain, ..
    } = recorded();
    let rows = query_json(
        &[pipeline, plain],
        "SELECT m.run, m.events, m.has_provenance, \
                (SELECT count(*) FROM events e WHERE e.run = m.run) AS loaded, \
                (SELECT count(*) FROM processes p WHERE p.run = m.run) AS processes \
         FROM manifest m ORDER BY m.run",
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        assert_eq!(row["loaded"], row["events"], "{row}");
    }
    let by_run: BTreeMap<&str, &Value> = rows
        .iter()
        .map(|row| (row["run"].as_str().unwrap(), row))
        .collect();
    assert_eq!(by_run[path(pipeline)]["has_provenance"], 1);
    assert!(by_run[path(pipeline)]["processes"].as_u64() > Some(2));
    assert_eq!(by_run[path(plain)]["has_provenance"], 0);
    assert_eq!(by_run[path(plain)]["processes"], 0);
}

#[test]
fn blame_tables_agree_with_provm_blame() {
    let Recorded {
        pipeline, untimed, ..
    } = recorded();
    let blamed = blame_json(pipeline);
    let sum = |by_device: &Value| -> u64 {
        let values = by_device.as_object().expect("a map by device").values();
        values.map(|n| n.as_u64().unwrap()).sum()
    };
    let expected: Vec<Value> = blamed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            json!({
                "pid": p["pid"], "command": p["command"], "wall_ns": p["wall_ns"],
                "guest_ns": p["guest_ns"], "vmm_ns": sum(&p["vmm_ns"]),
                "halted_ns": p["halted_ns"], "preempted_ns": p["preempted_ns"],
                "recorder_ns": p["recorder_ns"], "injected_ns": p["injected_ns"],
                "exits": sum(&p["exits"]),
            })
        })
        .collect();
    // blame's order: longest first, then by pid.
    let rows = query_json(
        &[pipeline],
        "SELECT pid, command, wall_ns, guest_ns, vmm_ns, halted_ns, preempted_ns, \
                recorder_ns, injected_ns, exits FROM blame ORDER BY wall_ns DESC, pid",
    );
    assert!(rows.len() > 1, "{rows:#?}");
    assert!(rows.iter().any(|row| row["command"] == "sh"), "{rows:#?}");
    assert_eq!(rows, expected);

    // Per device, over the processes: blame's totals.
    let devices = query_json(
        &[pipeline],
        "SELECT device, sum(exits) AS exits, sum(vmm_ns) AS vmm_ns FROM blame_devices GROUP BY device",
    );
    let column = |name: &str| -> Value {
        devices
            .iter()
            .map(|row| {
                (
                    row["device"].as_str().unwrap().to_owned(),
                    row[name].clone(),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    assert_eq!(column("exits"), blamed["total"]["exits"]);
    assert_eq!(column("vmm_ns"), blamed["total"]["vmm_ns"]);
    assert!(sum(&blamed["total"]["vmm_ns"]) > 0, "{blamed}");
    // Each row's histogram holds its exits, and its percentiles rise.
    let odd = query_json(
        &[pipeline],
        "SELECT * FROM blame_devices WHERE exits != (SELECT sum(value) FROM json_each(latency)) \
         OR json_array_length(latency) != 24 OR NOT (p50_ns <= p90_ns AND p90_ns <= p99_ns)",
    );
    assert!(odd.is_empty(), "{odd:#?}");

    // A trace without timing: empty tables, not an error.
    let both = query_json(
        &[pipeline, untimed],
        "SELECT run, has_timing, (SELECT count(*) FROM blame b WHERE b.run = m.run) AS processes, \
                (SELECT count(*) FROM blame_devices d WHERE d.run = m.run) AS devices \
         FROM manifest m",
    );
    let by_run: BTreeMap<&str, &Value> = both
        .iter()
        .map(|row| (row["run"].as_str().unwrap(), row))
        .collect();
    assert_eq!(by_run[path(pipeline)]["has_timing"], 1);
    assert_eq!(by_run[path(pipeline)]["processes"], rows.len());
    assert_eq!(
        (
            &by_run[path(untimed)]["has_timing"],
            &by_run[path(untimed)]["processes"],
            &by_run[path(untimed)]["devices"]
        ),
        (&json!(0), &json!(0), &json!(0))
    );
}

#[test]
fn bad_queries_say_what_is_wrong_and_what_there_is() {
    let trace = path(&recorded().pipeline);
    for (sql, expected) in [
        ("SELEC * FROM events", "syntax error"),
        ("SELECT * FROM nosuch", "no such table: nosuch"),
        ("SELECT nope FROM events", "no such column: nope"),
    ] {
        let refused = provm(&["query", trace, sql]);
        assert_eq!(refused.status, PROVM_FAILED, "{sql}: {}", refused.stdout);
        for needed in [
            expected,
            "the tables and their columns",
            "events(run, idx, exit, kind",
        ] {
            assert!(refused.stderr.contains(needed), "{sql}: {}", refused.stderr);
        }
    }
    let schema = succeeds(&["query", "--schema"]);
    for table in [
        "manifest (table)",
        "events (table)",
        "exits (view)",
        "edges (table)",
        "syscalls (table)",
    ] {
        assert!(schema.contains(table), "{schema}");
    }
}

#[test]
fn export_sqlite_writes_a_database_python_opens() {
    let Recorded {
        pipeline, plain, ..
    } = recorded();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("run.db");
    succeeds(&[
        "export",
        "sqlite",
        path(pipeline),
        path(plain),
        "-o",
        path(&db),
    ]);
    let script = "import json, sqlite3, sys\n\
                  db = sqlite3.connect(sys.argv[1])\n\
                  print(json.dumps({run: {t: db.execute(f'SELECT count(*) FROM {t} WHERE run = ?', (run,)).fetchone()[0]\n\
                  for t in ['manifest', 'events', 'exits', 'processes', 'files', 'edges']}\n\
                  for (run,) in db.execute('SELECT run FROM manifest')}))";
    let python = Command::new("python3")
        .args(["-c", script, path(&db)])
        .output()
        .expect("python3 runs");
    assert!(
        python.status.success(),
        "{}",
        String::from_utf8_lossy(&python.stderr)
    );
    let counts: Value = serde_json::from_slice(&python.stdout).unwrap();
    for trace in [pipeline, plain] {
        let (total, by_kind) = inspect_counts(trace);
        let exits: u64 = by_kind
            .iter()
            .filter(|(kind, _)| is_exit_kind(kind))
            .map(|(_, n)| n)
            .sum();
        let run = &counts[path(trace)];
        assert_eq!(run["manifest"], 1, "{counts}");
        assert_eq!(run["events"].as_u64(), Some(total), "{counts}");
        assert_eq!(run["exits"].as_u64(), Some(exits), "{counts}");
    }
    assert!(
        counts[path(pipeline)]["edges"].as_u64().unwrap() > 10,
        "{counts}"
    );

    // An output that exists is the user's.
    let before = digest(&db);
    let refused = provm(&["export", "sqlite", path(plain), "-o", path(&db)]);
    assert_eq!(refused.status, PROVM_FAILED);
    assert!(
        refused.stderr.contains("pass --force"),
        "{}",
        refused.stderr
    );
    assert_eq!(digest(&db), before);
    succeeds(&["export", "sqlite", path(plain), "-o", path(&db), "--force"]);
    assert_ne!(digest(&db), before);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file is left"
    );
}

fn is_exit_kind(kind: &str) -> bool {
    [
        "port read",
        "port write",
        "MMIO read",
        "MMIO write",
        "HLT",
        "interrupt window",
        "RDMSR",
    ]
    .contains(&kind)
}

#[test]
fn export_timeline_writes_the_trace_event_format() {
    let Recorded {
        pipeline, plain, ..
    } = recorded();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    succeeds(&["export", "timeline", path(pipeline), "-o", path(&json)]);
    let document: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = document["traceEvents"]
        .as_array()
        .expect("a traceEvents array");
    check_trace_event_format(events);

    // One thread per guest process, named, each with its programs.
    let processes = query_json(&[pipeline], "SELECT pid, command FROM processes");
    for process in &processes {
        let pid = process["pid"].as_u64().unwrap();
        let on_thread = |phase: &str| {
            events
                .iter()
                .filter(|e| e["ph"] == phase && e["pid"] == 1 && e["tid"].as_u64() == Some(pid))
                .count()
        };
        assert_eq!(on_thread("M"), 1, "pid {pid}");
        assert!(on_thread("X") >= 1, "pid {pid}");
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "X" && e["name"] == process["command"]),
            "{process}"
        );
    }
    // Exits by device, as counters; their sum is the run's port and MMIO exits.
    let counted: u64 = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "VM exits by device")
        .flat_map(|e| e["args"].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    let expected = &query_json(
        &[pipeline],
        "SELECT count(*) AS n FROM exits WHERE device IS NOT NULL",
    )[0]["n"];
    assert_eq!(Some(counted), expected.as_u64());

    // The VMM's time by device, cumulative: it never falls, is spread over
    // the run, and ends at the run's end with provm blame's totals.
    let blame_samples = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .filter(|e| {
                e["ph"] == "C"
                    && e["name"]
                        .as_str()
                        .unwrap()
                        .starts_with("VMM time by device")
            })
            .cloned()
            .collect()
    };
    let samples = blame_samples(events);
    let last = samples.last().expect("a VMM time counter");
    assert_eq!(last["args"], blame_json(pipeline)["total"]["vmm_ns"]);
    let run = events
        .iter()
        .find(|e| e["ph"] == "X" && e["pid"] == 2)
        .unwrap();
    let end = run["ts"].as_f64().unwrap() + run["dur"].as_f64().unwrap();
    assert!(
        (last["ts"].as_f64().unwrap() - end).abs() < 0.01,
        "{last} {run}"
    );
    for pair in samples.windows(2) {
        assert!(pair[0]["ts"].as_f64() <= pair[1]["ts"].as_f64(), "{pair:?}");
        for (device, value) in pair[0]["args"].as_object().unwrap() {
            assert!(
                value.as_u64() <= pair[1]["args"][device].as_u64(),
                "{pair:?}"
            );
        }
    }
    let between = samples.iter().any(|sample| {
        sample["args"]
            .as_object()
            .unwrap()
            .iter()
            .any(|(device, value)| {
                (1..last["args"][device].as_u64().unwrap()).contains(&value.as_u64().unwrap())
            })
    });
    assert!(between, "no value between 0 and the total: {samples:#?}");

    // Without provenance: the VMM's tracks only, and a word about --prov.
    let plain_json = dir.path().join("plain.json");
    let finished = provm(&["export", "timeline", path(plain), "-o", path(&plain_json)]);
    assert_eq!(finished.status, 0, "{}", finished.stderr);
    assert!(finished.stderr.contains("--prov"), "{}", finished.stderr);
    let document: Value = serde_json::from_slice(&std::fs::read(&plain_json).unwrap()).unwrap();
    let events = document["traceEvents"].as_array().unwrap();
    check_trace_event_format(events);
    assert!(!events.iter().any(|e| e["ph"] == "X" && e["pid"] == 1));

    // Without timing: no VMM time counter, and no failure.
    let untimed_json = dir.path().join("untimed.json");
    succeeds(&[
        "export",
        "timeline",
        path(&recorded().untimed),
        "-o",
        path(&untimed_json),
    ]);
    let document: Value = serde_json::from_slice(&std::fs::read(&untimed_json).unwrap()).unwrap();
    let events = document["traceEvents"].as_array().unwrap();
    check_trace_event_format(events);
    assert!(blame_samples(events).is_empty());

    // With a replay: the processes, and every system call on its thread,
    // nested in its process's life.
    let replayed_json = dir.path().join("replayed.json");
    succeeds(&[
        "export",
        "timeline",
        "--with-replay",
        path(plain),
        "-o",
        path(&replayed_json),
    ]);
    let document: Value = serde_json::from_slice(&std::fs::read(&replayed_json).unwrap()).unwrap();
    let events = document["traceEvents"].as_array().unwrap();
    check_trace_event_format(events);
    let write = events
        .iter()
        .find(|e| {
            e["ph"] == "X"
                && e["name"] == "write"
                && e["args"]["call"].as_str().unwrap_or("").contains("plain")
        })
        .unwrap_or_else(|| panic!("no write of 'plain': {events:#?}"));
    let shell = events
        .iter()
        .find(|e| {
            e["ph"] == "X"
                && e["tid"] == write["tid"]
                && e["name"] != "write"
                && e["args"]["status"].is_i64()
        })
        .unwrap_or_else(|| panic!("no process on thread {}", write["tid"]));
    // Compared in whole nanoseconds, as the exporter counted them: the sum
    // of two microsecond floats can fall a rounding short of a third.
    let (start, end) = (nanos(shell, "ts"), nanos(shell, "ts") + nanos(shell, "dur"));
    let at = nanos(write, "ts");
    assert!(start <= at && at <= end, "{write} outside {shell}");

    let refused = provm(&["export", "timeline", path(plain), "-o", path(&json)]);
    assert_eq!(refused.status, PROVM_FAILED);
    assert!(
        refused.stderr.contains("pass --force"),
        "{}",
        refused.stderr
    );
}

/// An event's time or duration, in microseconds in the file, as the whole
/// nanoseconds the exporter wrote.
fn nanos(event: &Value, key: &str) -> i64 {
    (event[key].as_f64().unwrap() * 1000.0).round() as i64
}

/// The Trace Event Format's documented shape: every event has a phase, a
/// name, and integer pid and tid; complete (X), counter (C) and instant
/// (i) events have a time in microseconds, X a duration, C numeric series
/// in args; metadata (M) names a process or thread in args.name.
fn check_trace_event_format(events: &[Value]) {
    assert!(!events.is_empty());
    for event in events {
        let phase = event["ph"]
            .as_str()
            .unwrap_or_else(|| panic!("no ph: {event}"));
        assert!(event["name"].is_string(), "{event}");
        assert!(event["pid"].is_u64() && event["tid"].is_u64(), "{event}");
        match phase {
            "M" => {
                assert!(
                    ["process_name", "thread_name"].contains(&event["name"].as_str().unwrap()),
                    "{event}"
                );
                assert!(event["args"]["name"].is_string(), "{event}");
            }
            "X" | "C" | "i" => {
                assert!(event["ts"].as_f64().is_some_and(|ts| ts >= 0.0), "{event}");
                if phase == "X" {
                    assert!(event["dur"].as_f64().is_some_and(|d| d >= 0.0), "{event}");
                }
                if phase == "C" {
                    let args = event["args"].as_object().expect("counter args");
                    assert!(args.values().all(Value::is_number), "{event}");
                }
            }
            other => panic!("unexpected phase {other}: {event}"),
        }
    }
}

/// The Makefile of the pipeline, run by the host's make on a copy of its
/// input, rebuilds outputs with the recorded digests.
#[test]
fn export_makefile_rebuilds_the_recorded_outputs() {
    let Recorded {
        pipeline, plain, ..
    } = recorded();
    let makefile = succeeds(&["export", "makefile", path(pipeline)]);
    assert!(
        makefile.contains("/data/out.txt: /data/mid.txt\n"),
        "{makefile}"
    );

    // The guest's /data is a directory of the host's here.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("in.txt"), "pear\napple\nfig\n").unwrap();
    let makefile_path = dir.path().join("Makefile");
    std::fs::write(&makefile_path, makefile.replace("/data", path(&data))).unwrap();
    let make = Command::new("make")
        .arg("-f")
        .arg(&makefile_path)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("make runs");
    assert!(
        make.status.success(),
        "{}",
        String::from_utf8_lossy(&make.stderr)
    );
    let recorded = query_json(
        &[pipeline],
        "SELECT name, sha256 FROM files WHERE name IN ('/data/mid.txt', '/data/out.txt') \
         AND id IN (SELECT source FROM edges WHERE relation = 'wasGeneratedBy')",
    );
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    for file in &recorded {
        let rebuilt = data.join(file["name"].as_str().unwrap().trim_start_matches("/data/"));
        assert_eq!(
            digest(&rebuilt),
            file["sha256"].as_str().unwrap(),
            "{}",
            rebuilt.display()
        );
    }

    // Written to a file: never over one that exists.
    let output = dir.path().join("Makefile.out");
    succeeds(&["export", "makefile", path(pipeline), "-o", path(&output)]);
    assert_eq!(std::fs::read_to_string(&output).unwrap(), makefile);
    let refused = provm(&["export", "makefile", path(pipeline), "-o", path(&output)]);
    assert!(
        refused.stderr.contains("pass --force"),
        "{}",
        refused.stderr
    );
    // Without --prov, the provenance comes from a replay: `echo plain`
    // generated no file, so the Makefile has no rule.
    let derived = provm(&["export", "makefile", path(plain)]);
    assert_eq!(derived.status, 0, "{}", derived.stderr);
    assert!(
        derived.stderr.contains("deriving its provenance"),
        "{}",
        derived.stderr
    );
    assert!(
        derived.stdout.contains(".PHONY: all\nall: \n"),
        "{}",
        derived.stdout
    );
}

/// `skopeo inspect --config` of an exported archive.
fn oci_config(archive: &Path) -> Value {
    let inspect = Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(format!("oci-archive:{}:run", archive.display()))
        .output()
        .expect("skopeo runs (scripts/install-deps installs it)");
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    serde_json::from_slice(&inspect.stdout).unwrap()
}

/// The image as a runtime bundle (config.json and rootfs), unpacked by
/// umoci from the archive; its process without a terminal, as a test runs.
fn oci_bundle(archive: &Path, into: &Path) -> PathBuf {
    let layout = into.join("layout");
    std::fs::create_dir(&layout).unwrap();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout)
        .status()
        .unwrap();
    assert!(untar.success());
    let bundle = into.join("bundle");
    let unpack = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:run", layout.display()))
        .arg(&bundle)
        .output()
        .expect("umoci runs (scripts/install-deps installs it)");
    assert!(
        unpack.status.success(),
        "{}",
        String::from_utf8_lossy(&unpack.stderr)
    );
    let config_path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["process"]["terminal"] = false.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    bundle
}

/// Runs the bundle's container (the image's entrypoint) with runc.
fn runc_run(bundle: &Path) -> std::process::Output {
    let id = format!(
        "provm-test-{}-{}",
        std::process::id(),
        bundle
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
    );
    Command::new("runc")
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runc runs (scripts/install-deps installs it)")
}

#[test]
fn export_oci_holds_what_the_run_read_and_runs_it_again() {
    let Recorded {
        pipeline, plain, ..
    } = recorded();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("pipeline.tar");
    succeeds(&["export", "oci", path(pipeline), "-o", path(&archive)]);
    let config = oci_config(&archive);
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/bin/sh", "-c", PIPELINE]),
        "{config:#}"
    );
    assert_eq!(config["config"]["WorkingDir"], "/data", "{config:#}");

    // The inputs and programs are in it, the run's own outputs are not; run
    // as a container, the pipeline writes what it wrote in the guest.
    let bundle = oci_bundle(&archive, dir.path());
    let rootfs = bundle.join("rootfs");
    assert!(rootfs.join("data/in.txt").is_file());
    assert!(rootfs.join("bin/busybox").is_file());
    assert!(rootfs.join("bin/sh").is_symlink());
    assert!(!rootfs.join("data/mid.txt").exists());
    let rerun = runc_run(&bundle);
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let recorded = query_json(
        &[pipeline],
        "SELECT sha256 FROM files WHERE name = '/data/out.txt' \
         AND id IN (SELECT source FROM edges WHERE relation = 'wasGeneratedBy')",
    );
    assert_eq!(
        digest(&rootfs.join("data/out.txt")),
        recorded[0]["sha256"].as_str().unwrap()
    );

    // A trace without --prov: its provenance comes from a replay, and the
    // image prints what the recorded command printed.
    let archive = dir.path().join("plain.tar");
    let exported = provm(&["export", "oci", path(plain), "-o", path(&archive)]);
    assert_eq!(exported.status, 0, "{}", exported.stderr);
    assert!(
        exported.stderr.contains("deriving its provenance"),
        "{}",
        exported.stderr
    );
    let plain_dir = dir.path().join("plain");
    std::fs::create_dir(&plain_dir).unwrap();
    let rerun = runc_run(&oci_bundle(&archive, &plain_dir));
    assert_eq!(
        String::from_utf8_lossy(&rerun.stdout),
        "plain\n",
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );

    let refused = provm(&["export", "oci", path(plain), "-o", path(&archive)]);
    assert_eq!(refused.status, PROVM_FAILED);
    assert!(
        refused.stderr.contains("pass --force"),
        "{}",
        refused.stderr
    );
}

/// A dynamically linked program on a merged-/usr Debian (coreutils'
/// `date`): its ELF
/// interpreter, which the kernel maps with no system call of the
/// program's, is reached through links to absolute paths (/lib64 ->
/// usr/lib64, ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...), each
/// followed from the root; the image runs under runc as it ran recorded.
#[test]
fn export_oci_of_a_dynamically_linked_program_runs_it_again() {
    let image = common::debian_image();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("date.provm");
    let archive = dir.path().join("date.tar");
    {
        let _guest = one_guest_at_a_time();
        let recorded = provm(&[
            "record",
            "-o",
            path(&trace),
            path(image),
            "--",
            "date",
            "-u",
            "-d",
            "@0",
            "+%Y",
        ]);
        assert_eq!(recorded.status, 0, "{}", recorded.stderr);
        assert_eq!(recorded.stdout, "1970\n");
        succeeds(&["export", "oci", path(&trace), "-o", path(&archive)]);
    }
    let bundle = oci_bundle(&archive, dir.path());
    let interpreter = bundle.join("rootfs/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    assert!(interpreter.is_file(), "no {}", interpreter.display());
    let rerun = runc_run(&bundle);
    assert_eq!(
        String::from_utf8_lossy(&rerun.stdout),
        "1970\n",
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
}

#[test]
fn a_query_that_reads_the_syscalls_table_replays_the_run_to_fill_it() {
    let Recorded { pipeline, .. } = recorded();
    let opens = query_json(
        &[pipeline],
        "SELECT comm, ret, json_extract(args, '$[2].names') AS flags FROM syscalls \
         WHERE name = 'openat' AND path = '/data/in.txt'",
    );
    assert!(
        opens.iter().any(|row| row["comm"] == "sort"
            && row["flags"] == "O_RDONLY"
            && row["ret"].as_i64() >= Some(0)),
        "{opens:#?}"
    );
    let written = query_json(
        &[pipeline],
        "SELECT sum(ret) AS bytes FROM syscalls WHERE name = 'write' AND path = '/data/out.txt'",
    );
    // `wc -l mid.txt` wrote "3 mid.txt\n".
    assert_eq!(written[0]["bytes"], 10, "{written:#?}");
}
