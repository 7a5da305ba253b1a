//! Data in and out: a host folder as the command's input (`--input`), its
//! standard input, its results copied back (`--output`), a replay with the
//! host folder gone, the results out of the trace (`export files`), and
//! bad data arguments refused before anything is written.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{images, path, provm, provm_with_env, Finished};
use sha2::{Digest, Sha256};

/// A CSV of 200 measurements, a note in a subfolder and a link to it.
fn host_folder(at: &Path) -> String {
    fs::create_dir_all(at.join("notes")).unwrap();
    let mut csv = String::from("station,value\n");
    for i in 0..200 {
        csv += &format!("s{},{}\n", i % 4, (i * 37) % 101);
    }
    fs::write(at.join("measurements.csv"), &csv).unwrap();
    fs::write(at.join("notes/readme.txt"), "collected by hand\n").unwrap();
    std::os::unix::fs::symlink("notes/readme.txt", at.join("readme")).unwrap();
    csv
}

/// The per-station sums of values above `threshold`, as the guest's awk
/// prints them (sorted by station).
fn expected_summary(csv: &str, threshold: u32) -> String {
    let mut sums = std::collections::BTreeMap::new();
    for line in csv.lines().skip(1) {
        let (station, value) = line.split_once(',').unwrap();
        let value: u32 = value.parse().unwrap();
        if value > threshold {
            *sums.entry(station.to_owned()).or_insert(0) += value;
        }
    }
    sums.iter().map(|(s, v)| format!("{s} {v}\n")).collect()
}

/// `provm ARGS` with `stdin` as its standard input.
fn provm_with_stdin(args: &[&str], stdin: &[u8], cwd: &Path) -> Finished {
    let stdin_file = cwd.join("stdin.txt");
    fs::write(&stdin_file, stdin).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::from(fs::File::open(&stdin_file).unwrap()))
        .output()
        .unwrap();
    Finished {
        status: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The analysis: the threshold from stdin, the CSV from the input folder,
/// the summary and a copy of the notes into the output folder; and a write
/// into the input, which must fail.
const ANALYSIS: &str = "read threshold; \
    awk -F, -v t=$threshold 'NR > 1 && $2 > t { sum[$1] += $2 } END { for (s in sum) print s, sum[s] }' \
        /data/measurements.csv | sort > /results/summary.txt; \
    cp -r /data/notes /results/; cat /data/readme; \
    touch /data/new 2>/dev/null && echo input-writable || echo input-read-only";

#[test]
fn a_host_folder_goes_in_its_results_come_back_and_the_trace_replays_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let csv = host_folder(&work.join("data"));
    let image = path(&images().tiny_qcow2);

    let recorded = provm_with_stdin(
        &[
            "record",
            "-o",
            "run.provm",
            "--input",
            "data:/data",
            "--output",
            "/results:results",
            image,
            "--",
            "/bin/sh",
            "-c",
            ANALYSIS,
        ],
        b"50\n",
        work,
    );
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(
        recorded.stdout, "collected by hand\ninput-read-only\n",
        "{}",
        recorded.stderr
    );
    let summary = fs::read_to_string(work.join("results/summary.txt")).unwrap();
    assert_eq!(summary, expected_summary(&csv, 50));
    assert!(!summary.is_empty());
    assert_eq!(
        fs::read_to_string(work.join("results/notes/readme.txt")).unwrap(),
        "collected by hand\n"
    );
    assert!(
        recorded
            .stderr
            .contains("copied /results to results (2 files"),
        "{}",
        recorded.stderr
    );

    // The trace says what went in; the host folder is then gone.
    let inspected = provm(&["inspect", path(&work.join("run.provm"))]);
    assert!(
        inspected
            .stdout
            .contains("input      data -> /data (2 files"),
        "{}",
        inspected.stdout
    );
    assert!(
        inspected.stdout.contains("stdin      3 bytes"),
        "{}",
        inspected.stdout
    );
    fs::remove_dir_all(work.join("data")).unwrap();

    let replayed = provm(&["replay", path(&work.join("run.provm"))]);
    assert_eq!(replayed.status, 0, "{}{}", replayed.stdout, replayed.stderr);
    assert!(
        replayed
            .stdout
            .contains("the exit status, the files left at /results and the disk writes"),
        "{}",
        replayed.stdout
    );

    let exported = work.join("exported");
    let export_files = |guest: &str, to: &Path| {
        provm(&[
            "export",
            "files",
            path(&work.join("run.provm")),
            guest,
            "-o",
            path(to),
        ])
    };
    let export = export_files("/results", &exported);
    assert_eq!(export.status, 0, "{}", export.stderr);
    assert_eq!(
        fs::read_to_string(exported.join("summary.txt")).unwrap(),
        summary
    );
    let again = export_files("/results", &exported);
    assert_ne!(again.status, 0, "an existing export must not be replaced");
    assert!(again.stderr.contains("--force"), "{}", again.stderr);
    let unknown = export_files("/tmp", &work.join("t"));
    assert!(
        unknown
            .stderr
            .contains("did not copy /tmp back; it copied /results"),
        "{}",
        unknown.stderr
    );
}

#[test]
fn run_passes_stdin_and_a_file_input_and_replaces_outputs_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    fs::write(work.join("words.txt"), "pear\napple\nfig\n").unwrap();
    let image = path(&images().tiny_qcow2);
    let args = [
        "run",
        "--input",
        "words.txt:/srv/words.txt",
        "--output",
        "/out:out",
        image,
        "--",
        "/bin/sh",
        "-c",
        "sort /srv/words.txt > /out/sorted; wc -l > /out/stdin-lines",
    ];
    let ran = provm_with_stdin(&args, b"1\n2\n3\n4\n", work);
    assert_eq!(ran.status, 0, "{}", ran.stderr);
    assert_eq!(
        fs::read_to_string(work.join("out/sorted")).unwrap(),
        "apple\nfig\npear\n"
    );
    assert_eq!(
        fs::read_to_string(work.join("out/stdin-lines"))
            .unwrap()
            .trim(),
        "4"
    );
    let refused = provm_with_stdin(&args, b"", work);
    assert_eq!(refused.status, common::PROVM_FAILED);
    assert!(
        refused.stderr.contains("out exists; pass --force"),
        "{}",
        refused.stderr
    );
    let forced: Vec<&str> = [&args[..1], &["--force"], &args[1..]].concat();
    let replaced = provm_with_stdin(&forced, b"x\n", work);
    assert_eq!(replaced.status, 0, "{}", replaced.stderr);
    assert_eq!(
        fs::read_to_string(work.join("out/stdin-lines"))
            .unwrap()
            .trim(),
        "1"
    );
}

/// Each bad data argument is named with its fix, before the guest starts:
/// no trace is left behind.
#[test]
fn bad_data_arguments_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    fs::create_dir(work.join("data")).unwrap();
    fs::write(work.join("big"), vec![0u8; 40 << 20]).unwrap();
    fs::create_dir(work.join("taken")).unwrap();
    let image = path(&images().tiny_qcow2);
    let cases: [(&[&str], &str); 5] = [
        (&["--input", "nope:/data"], "the input nope does not exist"),
        (&["--input", "data:data"], "is not an absolute guest path"),
        (&["--input", "data:/proc/data"], "a kernel file system"),
        (&["--output", "/out/../..:x"], "outside the guest's root"),
        (&["--output", "/out:taken"], "taken exists; pass --force"),
    ];
    for (extra, message) in cases {
        let mut args = vec!["record", "-o", "t.provm"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[image, "--", "true"]);
        let refused = provm_with_stdin(&args, b"", work);
        assert_ne!(refused.status, 0, "{extra:?}");
        assert!(
            refused.stderr.contains(message),
            "{extra:?}: {}",
            refused.stderr
        );
        assert!(!work.join("t.provm").exists(), "{extra:?} left a trace");
    }
    // Standard input is kept in memory (a large input goes by disk).
    let args = [
        "record", "-o", "t.provm", "--memory", "64", image, "--", "true",
    ];
    let refused = provm_with_stdin(&args, &fs::read(work.join("big")).unwrap(), work);
    assert!(
        refused.stderr.contains("pass --memory"),
        "{}",
        refused.stderr
    );
    assert!(!work.join("t.provm").exists());
}

/// A name the input disk cannot hold (not UTF-8, or with a newline: its
/// builder's debugfs script is text of one command a line) is refused
/// with the fix, rename it, before the guest starts: no trace, and
/// nothing left in the cache's input disks.
#[test]
fn a_name_the_input_disk_cannot_hold_is_refused_and_nothing_is_written() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let real_cache = provm_engine::kernel::cache_dir();
    for name in [&b"two\nlines.csv"[..], &b"latin1-\xe9t\xe9.csv"[..]] {
        let data = work.join("data");
        let _ = fs::remove_dir_all(&data);
        fs::create_dir(&data).unwrap();
        // Large enough to go by disk.
        fs::write(data.join("fine.bin"), vec![7u8; 128 << 10]).unwrap();
        fs::write(data.join(std::ffi::OsStr::from_bytes(name)), b"a,b\n").unwrap();
        // A cache of its own (with the built kernels), whose input disks
        // no other test writes.
        let cache = work.join("cache");
        let _ = fs::remove_dir_all(&cache);
        fs::create_dir(&cache).unwrap();
        std::os::unix::fs::symlink(real_cache.join("kernels"), cache.join("kernels")).unwrap();
        let refused = provm_with_env(
            &[
                "record",
                "-o",
                path(&work.join("t.provm")),
                "--input",
                &format!("{}:/data", path(&data)),
                path(&images().tiny_qcow2),
                "--",
                "true",
            ],
            &[("PROVM_CACHE", &cache)],
        );
        assert_eq!(refused.status, common::PROVM_FAILED, "{}", refused.stderr);
        assert!(
            refused.stderr.contains("rename it")
                && refused.stderr.contains("not UTF-8 or has a newline"),
            "{}",
            refused.stderr
        );
        assert!(!work.join("t.provm").exists(), "a trace was left");
        let left: Vec<_> = fs::read_dir(cache.join("inputs"))
            .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left in the cache: {left:?}");
    }
}

/// `len` bytes from the host's random generator: content no earlier run
/// had, so that its input disk is new to the cache.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut bytes).unwrap();
    bytes
}

/// A folder of fresh random data, 5 MiB in two files, with a link; the
/// guest's `sha256sum` of it, as the host computes it.
fn large_folder(at: &Path) -> String {
    fs::create_dir_all(at.join("sub")).unwrap();
    let files = [
        ("big.bin", random_bytes(4 << 20)),
        ("sub/small.bin", random_bytes(1 << 20)),
    ];
    let mut sums = String::new();
    for (name, bytes) in files {
        fs::write(at.join(name), &bytes).unwrap();
        sums += &format!("{}  {name}\n", provm_trace::hex(&Sha256::digest(&bytes)));
    }
    std::os::unix::fs::symlink("sub/small.bin", at.join("link")).unwrap();
    sums
}

/// Digests the input in the guest, follows its link and tries to write it.
const CHECK_LARGE: &str = "cd /data && sha256sum big.bin sub/small.bin && cat link | wc -c && \
    (touch /data/new 2>/dev/null && echo input-writable || echo input-read-only)";

fn record_large(work: &Path, trace: &str) -> Finished {
    provm(&[
        "record",
        "-o",
        path(&work.join(trace)),
        "--input",
        &format!("{}:/data", path(&work.join("data"))),
        path(&images().tiny_qcow2),
        "--",
        "/bin/sh",
        "-c",
        CHECK_LARGE,
    ])
}

#[test]
fn a_large_folder_goes_by_disk_and_the_trace_replays_from_its_copy_alone() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let sums = large_folder(&work.join("data"));
    let recorded = record_large(work, "run.provm");
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(
        recorded.stdout,
        format!("{sums}{}\ninput-read-only\n", 1 << 20),
        "{}",
        recorded.stderr
    );
    assert!(
        recorded.stderr.contains("made the input disk"),
        "{}",
        recorded.stderr
    );
    let inspected = provm(&["inspect", path(&work.join("run.provm"))]);
    let machine = format!("machine version {}", provm_vmm::machine_version::CURRENT);
    for shown in ["input disk ", "(embedded)", &machine] {
        let stdout = &inspected.stdout;
        assert!(stdout.contains(shown), "{shown}: {stdout}");
    }

    // No host folder, and a cache that has never seen the disk (nor the
    // image, which is named): the trace's copy is extracted and checked.
    fs::remove_dir_all(work.join("data")).unwrap();
    let cache = work.join("cache");
    let replayed = provm_with_env(
        &[
            "replay",
            "--image",
            path(&images().tiny_qcow2),
            path(&work.join("run.provm")),
        ],
        &[("PROVM_CACHE", &cache)],
    );
    assert_eq!(replayed.status, 0, "{}{}", replayed.stdout, replayed.stderr);
    assert!(
        replayed.stdout.starts_with("replay matched"),
        "{}",
        replayed.stdout
    );
    let extracted = fs::read_dir(cache.join("inputs")).unwrap().count();
    assert_eq!(extracted, 1);
}

#[test]
fn an_unchanged_input_is_built_and_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    large_folder(&work.join("data"));
    let inputs = images_cache_inputs();
    let first = record_large(work, "one.provm");
    assert_eq!(first.status, 0, "{}", first.stderr);
    assert!(
        first.stderr.contains("made the input disk"),
        "{}",
        first.stderr
    );
    let built = images_cache_inputs();
    assert_eq!(built.len(), inputs.len() + 1);
    let second = record_large(work, "two.provm");
    assert_eq!(second.status, 0, "{}", second.stderr);
    assert!(
        !second.stderr.contains("made the input disk"),
        "{}",
        second.stderr
    );
    assert_eq!(images_cache_inputs(), built);
    let disk = |trace: &str| {
        let inspected = provm(&["inspect", path(&work.join(trace))]);
        let line = inspected
            .stdout
            .lines()
            .find(|l| l.starts_with("input disk "))
            .map(str::to_owned);
        line.unwrap_or_else(|| panic!("{}", inspected.stdout))
    };
    assert_eq!(disk("one.provm"), disk("two.provm"));
    // The same length, other bytes: read again, and a disk of its own.
    fs::write(work.join("data/big.bin"), random_bytes(4 << 20)).unwrap();
    let third = record_large(work, "three.provm");
    assert_eq!(third.status, 0, "{}", third.stderr);
    assert!(
        third.stderr.contains("made the input disk"),
        "{}",
        third.stderr
    );
    assert_ne!(disk("one.provm"), disk("three.provm"));
}

/// The input disks in provm's cache.
fn images_cache_inputs() -> Vec<std::path::PathBuf> {
    let dir = provm_engine::kernel::cache_dir().join("inputs");
    let mut disks: Vec<_> = fs::read_dir(dir)
        .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
        .unwrap_or_default();
    disks.sort();
    disks
}

/// A pipe on provm's standard input streams to the command as it runs:
/// `head -n 2` ends after the two lines written, though the pipe stays
/// open (the old way read it to its end first, and waited for ever), and
/// the replay, whose input comes from the log, matches.
#[test]
fn a_pipe_left_open_streams_to_the_command_and_the_trace_replays() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("live.provm");
    let image = path(&images().tiny_qcow2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(["record", "-o", path(&trace), image, "--", "head", "-n", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until the recording ends.
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"first\nsecond\n").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("provm record still waits with the pipe open");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let recorded = child.wait_with_output().unwrap();
    drop(stdin);
    let stderr = String::from_utf8_lossy(&recorded.stderr);
    assert!(recorded.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&recorded.stdout), "first\nsecond\n");
    let inspected = provm(&["inspect", path(&trace)]);
    assert!(
        inspected.stdout.contains("stdin      live"),
        "{}",
        inspected.stdout
    );
    common::assert_replay_matches(&trace);
}

/// `provm record -t`: the command's streams are a terminal in the guest,
/// typed at from provm's, whose size the guest's takes at the start and
/// when it changes; the replay types and resizes where the recording did.
#[test]
fn a_terminal_types_at_the_command_and_its_new_size_reaches_the_guest() {
    let _guest = common::one_guest_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("terminal.provm");
    let image = path(&images().tiny_qcow2);
    let mut record = Command::new(env!("CARGO_BIN_EXE_provm"));
    record.args(["record", "-t", "-o", path(&trace), image, "--"]);
    record.args(["sh", "-c", common::ON_A_TERMINAL_SIZED]);
    let terminal = common::terminal::OnATerminal::spawn(record, 24, 80);
    let (status, output) = common::resized_then_typed(terminal);
    assert_eq!(status, Some(0), "{output}");
    let inspected = provm(&["inspect", path(&trace)]);
    assert!(
        inspected.stdout.contains("terminal   80x24 at the start"),
        "{}",
        inspected.stdout
    );
    common::assert_replay_matches(&trace);
}

/// `-t` without a terminal on provm's standard input is refused, naming
/// what is missing, before anything is written.
#[test]
fn a_terminal_asked_for_without_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("no-terminal.provm");
    let image = path(&images().tiny_qcow2);
    let refused = provm(&["record", "-t", "-o", path(&trace), image, "--", "true"]);
    assert_eq!(refused.status, 125, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("standard input is not one"),
        "{}",
        refused.stderr
    );
    assert!(!trace.exists());
}
