//! Replay as an instrument, on the real guest: analyses read system calls
//! and processes off a replay through breakpoints in the guest kernel, and
//! the replay still matches.

use crate::common;

use std::fs;
use std::path::PathBuf;

use common::{images, one_guest_at_a_time, path, provm, record_shell, PROVM_FAILED};
use serde_json::Value;

const IN_TEXT: &str = "provm analysis\n";
/// The example, after writing its input.
const SCRIPT: &str = "mkdir -p /data && printf 'provm analysis\\n' > /data/in.txt && \
                      sh -c 'cat /data/in.txt > /data/out.txt'";

fn trace_path(name: &str) -> PathBuf {
    common::trace_path(&common::scratch(module_path!()), name)
}

/// The JSON lines of `analysis` in `lines`.
fn of<'a>(lines: &'a [Value], analysis: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|line| line["analysis"] == analysis)
        .collect()
}

/// The calls named `name` whose argument `index` has `field` equal `value`.
fn calls<'a>(
    syscalls: &[&'a Value],
    name: &str,
    index: usize,
    field: &str,
    value: &str,
) -> Vec<&'a Value> {
    syscalls
        .iter()
        .filter(|call| call["name"] == name && call["args"][index][field] == value)
        .copied()
        .collect()
}

#[test]
fn analyses_log_system_calls_and_processes_and_the_replay_still_matches() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("analysis");
    let recorded = record_shell(&images().tiny_qcow2, &trace, &[], SCRIPT);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);

    let output = trace.with_extension("jsonl");
    let replay = provm(&[
        "replay",
        "--analyze",
        "syscalls,processes",
        "-o",
        path(&output),
        "--force",
        path(&trace),
    ]);
    assert_eq!(replay.status, 0, "{}\n{}", replay.stdout, replay.stderr);
    assert!(
        replay.stdout.contains("replay matched"),
        "{}",
        replay.stdout
    );
    let lines: Vec<Value> = fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let syscalls = of(&lines, "syscalls");

    let opened_in = calls(&syscalls, "openat", 1, "absolute", "/data/in.txt");
    assert!(
        opened_in
            .iter()
            .any(|call| call["args"][2]["names"] == "O_RDONLY" && call["ret"].as_i64() >= Some(0)),
        "no read-only openat of /data/in.txt: {opened_in:#?}"
    );
    let opened_out = calls(&syscalls, "openat", 1, "absolute", "/data/out.txt");
    assert!(
        opened_out
            .iter()
            .any(|call| call["args"][2]["names"] == "O_WRONLY|O_CREAT|O_TRUNC"),
        "no truncating openat of /data/out.txt: {opened_out:#?}"
    );
    // cat moves the bytes with read and write, or (busybox) with sendfile.
    let length = IN_TEXT.len() as i64;
    let read = calls(&syscalls, "read", 0, "path", "/data/in.txt");
    let sent = calls(&syscalls, "sendfile", 1, "path", "/data/in.txt");
    let moved_from_input = read
        .iter()
        .any(|call| call["ret"] == length && call["args"][1]["len"] == length)
        || sent
            .iter()
            .any(|call| call["ret"] == length && call["args"][0]["path"] == "/data/out.txt");
    assert!(
        moved_from_input,
        "no read or sendfile of {length} bytes from /data/in.txt: {read:#?} {sent:#?}"
    );
    if !read.is_empty() {
        let written = calls(&syscalls, "write", 0, "path", "/data/out.txt");
        assert!(
            written.iter().any(|call| call["ret"] == length),
            "cat read /data/in.txt but wrote no {length} bytes to /data/out.txt: {written:#?}"
        );
    }

    let processes = of(&lines, "processes");
    let inner = processes.iter().find(|process| {
        process["execs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|exec| exec[1][2] == "cat /data/in.txt > /data/out.txt")
    });
    let inner = inner.unwrap_or_else(|| panic!("no process ran the inner sh -c: {processes:#?}"));
    assert_eq!(inner["status"], 0, "{inner:#?}");
    // cat runs in the inner shell's process (busybox execs a last command)
    // or in a child of it.
    let ran_cat = |process: &&Value| {
        process["execs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|exec| exec[1] == serde_json::json!(["cat", "/data/in.txt"]))
    };
    assert!(
        processes
            .iter()
            .filter(|p| p["pid"] == inner["pid"] || p["ppid"] == inner["pid"])
            .any(ran_cat),
        "the inner shell ran no cat /data/in.txt: {processes:#?}"
    );
    // The text log, on standard output, is strace's shape.
    assert!(
        replay
            .stdout
            .contains("openat(AT_FDCWD, \"/data/in.txt\", O_RDONLY"),
        "{}",
        replay.stdout
    );

    let vmlinux = trace.with_extension("vmlinux");
    let extracted = provm(&[
        "replay",
        "--extract-kernel",
        "-o",
        path(&vmlinux),
        "--force",
        path(&trace),
    ]);
    assert_eq!(extracted.status, 0, "{}", extracted.stderr);
    assert_eq!(&fs::read(&vmlinux).unwrap()[..4], b"\x7fELF");
}

#[test]
fn bad_analysis_requests_are_refused_clearly() {
    let unknown = provm(&["replay", "--analyze", "syscall", "no-such.provm"]);
    assert_eq!(unknown.status, 2, "{}", unknown.stderr);
    // The message names the bad value and every analysis there is.
    for expected in [
        "invalid value 'syscall'",
        "[possible values: syscalls, processes, provenance]",
    ] {
        assert!(unknown.stderr.contains(expected), "{}", unknown.stderr);
    }

    let existing = trace_path("exists.jsonl");
    fs::write(&existing, "mine").unwrap();
    let refused = provm(&[
        "replay",
        "--analyze",
        "syscalls",
        "-o",
        path(&existing),
        "no-such.provm",
    ]);
    assert_eq!(refused.status, PROVM_FAILED, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("pass --force"),
        "{}",
        refused.stderr
    );
    assert_eq!(fs::read_to_string(&existing).unwrap(), "mine");
}
