//! `provm export parquet` end to end: the query tests' shared recordings
//! (no guest of this module's own) exported run by run into one
//! Hive-partitioned dataset and read back by the real DuckDB
//! (`scripts/duckdb`, which installs it from PyPI into provm's cache) by
//! glob, against what `provm query` answers over the same traces.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{self, digest, path, provm, PROVM_FAILED};
use crate::query::{query_json, recorded, Recorded};

/// Every table and view the dataset holds without `--with-replay`.
const TABLES: [&str; 9] = [
    "manifest",
    "events",
    "exits",
    "processes",
    "files",
    "edges",
    "blame",
    "blame_devices",
    "blame_vcpus",
];

/// `scripts/duckdb --json SQL`: its rows, each a list of values.
pub fn duckdb(sql: &str) -> Vec<Vec<Value>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/duckdb");
    let output = Command::new(script)
        .args(["--json", sql])
        .output()
        .expect("scripts/duckdb runs");
    assert!(
        output.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).expect("its JSON parses");
    serde_json::from_value(result["rows"].clone()).expect("rows of values")
}

/// The table's files in `dir`, all runs, as DuckDB reads them.
pub fn dataset(dir: &Path, table: &str) -> String {
    format!(
        "read_parquet('{}/{table}/*/*.parquet', hive_partitioning = true)",
        dir.display()
    )
}

/// `provm export parquet ARGS -o DIR`, which must succeed: what it said.
pub fn export(args: &[&str], dir: &Path) -> String {
    let mut all = vec!["export", "parquet"];
    all.extend(args);
    all.extend(["-o", path(dir)]);
    let finished = provm(&all);
    assert_eq!(finished.status, 0, "{all:?}: {}", finished.stderr);
    finished.stderr
}

/// Every file under `dir` with its digest.
fn files(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(next).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                pending.push(entry);
            } else {
                found.insert(entry.clone(), digest(&entry));
            }
        }
    }
    found
}

/// Rows keyed by run and their second column, the other columns as text:
/// what two engines' answers are compared as.
type ByRun = BTreeMap<(String, String), String>;

/// A value as text: a string's own, other values' JSON.
fn text(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

fn keyed(rows: impl IntoIterator<Item = (String, Vec<Value>)>) -> ByRun {
    rows.into_iter()
        .map(|(run, values)| {
            let rest: Vec<String> = values[1..].iter().map(text).collect();
            ((run, text(&values[0])), rest.join(" "))
        })
        .collect()
}

/// `provm query`'s rows of `sql` over `traces`, whose columns are
/// `columns` (`run` first: the trace's path, made the run's id in a
/// dataset, the trace's SHA-256).
fn by_run(traces: &[&Path], sql: &str, columns: &[&str]) -> ByRun {
    keyed(query_json(traces, sql).iter().map(|row| {
        let run = digest(Path::new(row["run"].as_str().unwrap()));
        let values = columns[1..].iter().map(|c| row[*c].clone()).collect();
        (run, values)
    }))
}

/// DuckDB's rows of `sql`, likewise (`run` first).
fn duckdb_by_run(sql: &str) -> ByRun {
    keyed(duckdb(sql).into_iter().map(|row| {
        let run = row[0].as_str().unwrap().to_owned();
        (run, row[1..].to_vec())
    }))
}

#[test]
fn export_parquet_appends_runs_that_duckdb_reads_by_glob() {
    let Recorded {
        pipeline, plain, ..
    } = recorded();
    let dir = common::scratch(module_path!()).join("dataset");
    let _ = std::fs::remove_dir_all(&dir);

    // Run by run: the second export adds to the first's dataset.
    let said = export(&[path(pipeline)], &dir);
    assert!(
        said.contains(&format!("run={}", digest(pipeline))),
        "{said}"
    );
    export(&[path(plain)], &dir);

    // The same run again is refused, naming the way to replace it, and
    // nothing changes; with --force its partitions are replaced.
    let before = files(&dir);
    let again = provm(&["export", "parquet", path(plain), "-o", path(&dir)]);
    assert_eq!(again.status, PROVM_FAILED, "{}", again.stderr);
    assert!(
        again.stderr.contains("already") && again.stderr.contains("--force"),
        "{}",
        again.stderr
    );
    assert_eq!(files(&dir), before);
    export(&[path(plain), "--force"], &dir);
    assert_eq!(
        files(&dir).keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "the same partitions, no temporary file left"
    );

    // Rows per run and table, as provm query counts them (one query each
    // side: every DuckDB started costs a third of a second).
    let traces = [pipeline.as_path(), plain.as_path()];
    let counts = |from: &dyn Fn(&str) -> String| {
        TABLES
            .map(|table| {
                format!(
                    "SELECT run, '{table}' AS name, count(*) AS n FROM {} GROUP BY run",
                    from(table)
                )
            })
            .join(" UNION ALL ")
    };
    let counted = by_run(
        &traces,
        &counts(&|table| table.to_owned()),
        &["run", "name", "n"],
    );
    assert_eq!(
        duckdb_by_run(&counts(&|table| dataset(&dir, table))),
        counted
    );
    // Both runs have a manifest, events and exits; only the one recorded
    // with --prov has a graph.
    let runs_of = |table: &str| counted.keys().filter(|(_, name)| name == table).count();
    for (table, runs) in [
        ("manifest", 2),
        ("events", 2),
        ("exits", 2),
        ("processes", 1),
    ] {
        assert_eq!(runs_of(table), runs, "{table}: {counted:?}");
    }
    // Real values: the events by kind, and the manifest's numbers.
    let sql = "SELECT run, kind, count(*) AS n, sum(len) AS len, sum(value) AS value, \
               max(guest_ns) AS guest_ns FROM {} GROUP BY run, kind";
    let columns = ["run", "kind", "n", "len", "value", "guest_ns"];
    assert_eq!(
        duckdb_by_run(&sql.replace("{}", &dataset(&dir, "events"))),
        by_run(&traces, &sql.replace("{}", "events"), &columns)
    );
    let sql = "SELECT run, argv, {started} AS started, events, exits, guest_ns, exit_status, \
               cwd FROM {}";
    let columns = [
        "run",
        "argv",
        "started",
        "events",
        "exits",
        "guest_ns",
        "exit_status",
        "cwd",
    ];
    let read = duckdb_by_run(
        &sql.replace("{started}", "epoch(started_unix)::BIGINT")
            .replace("{}", &dataset(&dir, "manifest")),
    );
    assert_eq!(
        read,
        by_run(
            &traces,
            &sql.replace("{started}", "started_unix")
                .replace("{}", "manifest"),
            &columns
        )
    );
    assert_eq!(read.len(), 2);

    // Typed columns: integers, booleans, timestamps and text as such, and
    // the run's id from the partition's name.
    let describe = ["manifest", "events", "processes"]
        .map(|table| {
            format!(
                "SELECT '{table}.' || column_name, column_type FROM (DESCRIBE SELECT * FROM {})",
                dataset(&dir, table)
            )
        })
        .join(" UNION ALL ");
    let types: BTreeMap<String, String> = duckdb(&describe)
        .into_iter()
        .map(|row| (text(&row[0]), text(&row[1])))
        .collect();
    for (column, kind) in [
        ("manifest.run", "VARCHAR"),
        ("manifest.argv", "VARCHAR"),
        ("manifest.events", "BIGINT"),
        ("manifest.host_seconds", "DOUBLE"),
        ("manifest.complete", "BOOLEAN"),
        ("manifest.started_unix", "TIMESTAMP WITH TIME ZONE"),
        ("events.is_exit", "BOOLEAN"),
        ("events.guest_ns", "BIGINT"),
        ("processes.start_ns", "TIMESTAMPTZ_NS"),
    ] {
        assert_eq!(
            types.get(column).map(String::as_str),
            Some(kind),
            "{types:#?}"
        );
    }
    let processes = duckdb(&format!(
        "SELECT count(*) FROM {} WHERE start_ns > TIMESTAMPTZ '2020-01-01 00:00:00+00' \
         AND end_ns >= start_ns AND run = '{}'",
        dataset(&dir, "processes"),
        digest(pipeline)
    ));
    assert!(processes[0][0].as_u64() > Some(2), "{processes:?}");
}

#[test]
fn export_parquet_with_replay_adds_the_system_calls() {
    let Recorded { plain, .. } = recorded();
    let dir = common::scratch(module_path!()).join("syscalls");
    let _ = std::fs::remove_dir_all(&dir);
    export(&[path(plain), "--with-replay", "--table", "syscalls"], &dir);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "only the table asked for"
    );
    let read = duckdb_by_run(&format!(
        "SELECT run, name, count(*) FROM {} GROUP BY run, name",
        dataset(&dir, "syscalls")
    ));
    let counted = by_run(
        &[plain],
        "SELECT run, name, count(*) AS n FROM syscalls GROUP BY run, name",
        &["run", "name", "n"],
    );
    assert!(read.len() > 5, "{read:?}");
    assert_eq!(read, counted);
}

#[test]
fn export_parquet_refuses_bad_input_naming_the_fix() {
    let dir = common::scratch(module_path!());
    let refused = |args: &[&str], needles: &[&str]| {
        let mut all = vec!["export", "parquet"];
        all.extend(args);
        let finished = provm(&all);
        assert_eq!(
            finished.status, PROVM_FAILED,
            "{all:?}: {}",
            finished.stderr
        );
        for needle in needles {
            assert!(
                finished.stderr.contains(needle),
                "{all:?}: {}",
                finished.stderr
            );
        }
        assert!(!finished.stderr.contains("panicked"), "{}", finished.stderr);
    };
    let missing = dir.join("no-such.provm");
    let out = dir.join("bad-input");
    refused(
        &[path(&missing), "-o", path(&out)],
        &[path(&missing), "no such trace"],
    );
    let file = dir.join("a-file");
    std::fs::write(&file, "mine").unwrap();
    refused(
        &[path(&missing), "-o", path(&file)],
        &[path(&file), "is a file", "directory"],
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    refused(
        &[path(&missing), "-o", path(&out), "--table", "nosuch"],
        &["no table or view nosuch", "manifest, events"],
    );
    refused(
        &[path(&missing), "-o", path(&out), "--table", "syscalls"],
        &["syscalls", "--with-replay"],
    );
    // A file that is no trace.
    refused(&[path(&file), "-o", path(&out)], &[path(&file)]);
}
