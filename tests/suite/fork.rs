//! What-if forks of a replay, end to end on the real guest through the
//! provm binary: one pinned recording, forked at several points with each
//! fault, its forks compared and replayed.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{
    assert_replay_matches, event_log_digest, images, one_guest_at_a_time, path, provm, Finished,
};
use provm_trace::events::Event;
use provm_trace::reader::Trace;

/// The clock, entropy, then a program that ignores a failed write, then
/// one that checks it (tests/data/disk_write.c: one O_DIRECT block each).
const SCRIPT: &str = "date +%s; head -c 8 /dev/urandom | od -An -tx1; \
    disk_write ignore /data/a a; disk_write check /data/b b";
/// What the disk writes of the two programs' blocks hold.
const IGNORING_BLOCK: [u8; 4096] = [b'a'; 4096];
const CHECKING_BLOCK: [u8; 4096] = [b'b'; 4096];

struct Recording {
    trace: PathBuf,
    stdout: String,
    events_sha256: String,
}

/// The pinned recording every test forks (made once, by whichever test
/// comes first, under the guest lock it holds).
fn recording() -> &'static Recording {
    static RECORDING: OnceLock<Recording> = OnceLock::new();
    RECORDING.get_or_init(|| {
        let trace = common::scratch(module_path!()).join("forked.provm");
        let recorded = common::record_shell(&images().tiny_qcow2, &trace, &["--pinned"], SCRIPT);
        assert_eq!(recorded.status, 0, "{}", recorded.stderr);
        Recording {
            trace,
            events_sha256: event_log_digest(&recorded).to_owned(),
            stdout: recorded.stdout,
        }
    })
}

/// `provm replay RECORDING --fork-at AT --inject FAULT -o OUT`, which must
/// succeed.
fn fork(at: &str, fault: &str, out: &str) -> (Finished, PathBuf) {
    let output = common::scratch(module_path!()).join(format!("{out}.provm"));
    let forked = provm(&[
        "replay",
        path(&recording().trace),
        "--fork-at",
        at,
        "--inject",
        fault,
        "--force",
        "-o",
        path(&output),
    ]);
    assert_eq!(forked.status, 0, "{}{}", forked.stdout, forked.stderr);
    (forked, output)
}

/// Asserts that the fork's verdict starts with `expected`.
fn assert_verdict(forked: &Finished, expected: &str) {
    let verdict = forked
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in: {}", forked.stdout));
    assert!(verdict.starts_with(expected), "{}", forked.stdout);
}

/// The `disk-write:N` fork point of the write of `block` in the recording.
fn disk_write_of(trace: &Path, block: &[u8]) -> String {
    let wanted = Event::disk_write(0, block);
    let trace = Trace::open(trace).unwrap();
    let mut events = trace.events().unwrap();
    let mut nth = 0;
    while let Some(event) = events.next_event().unwrap() {
        if let Event::DiskWrite { len, digest, .. } = event {
            nth += 1;
            if matches!(wanted, Event::DiskWrite { len: l, digest: d, .. } if l == len && d == digest)
            {
                return format!("disk-write:{nth}");
            }
        }
    }
    panic!("the recording has no disk write of that block");
}

/// The fork's stdout as the comparison quotes it (when it differs).
fn fork_stdout(forked: &Finished) -> Vec<String> {
    forked
        .stdout
        .lines()
        .skip_while(|line| *line != "stdout of the fork:")
        .skip(1)
        .map_while(|line| line.strip_prefix("  | "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_fork_that_injects_nothing_is_the_recording_again_and_replays() {
    let _guest = one_guest_at_a_time();
    let recording = recording();
    assert!(
        recording.stdout.contains("wrote /data/b"),
        "{}",
        recording.stdout
    );
    for (at, name) in [
        ("0", "none-at-0"),
        (
            &*disk_write_of(&recording.trace, &IGNORING_BLOCK),
            "none-mid",
        ),
        // Inside the VM exit that submits a read, not between two events.
        ("disk-read:3", "none-at-a-read"),
    ] {
        let (forked, trace) = fork(at, "none", name);
        assert_verdict(&forked, "identical");
        // A pinned recording goes on in the fork's logical time exactly as
        // it did: the same log, event for event.
        assert_eq!(event_log_digest(&forked), recording.events_sha256, "{at}");
        assert_replay_matches(&trace);
    }
}

#[test]
fn identical_forks_have_identical_event_logs_and_a_disk_error_replays() {
    let _guest = one_guest_at_a_time();
    let at = disk_write_of(&recording().trace, &IGNORING_BLOCK);
    let (first, trace) = fork(&at, "disk-error", "disk-error-1");
    let (second, _) = fork(&at, "disk-error", "disk-error-2");
    assert_eq!(event_log_digest(&first), event_log_digest(&second));
    assert_ne!(event_log_digest(&first), recording().events_sha256);
    // The device's error status is not logged: the replay injects it again.
    assert_replay_matches(&trace);
    let inspect = provm(&["inspect", path(&trace)]);
    assert!(
        inspect.stdout.contains(&format!("at {at} (event ")),
        "{}",
        inspect.stdout
    );
    assert!(
        inspect.stdout.contains("fault disk-error"),
        "{}",
        inspect.stdout
    );
}

#[test]
fn a_write_error_ignored_is_silently_different_and_one_checked_is_handled() {
    let _guest = one_guest_at_a_time();
    let trace = &recording().trace;
    let (ignored, _) = fork(
        &disk_write_of(trace, &IGNORING_BLOCK),
        "disk-error",
        "ignored",
    );
    assert_verdict(&ignored, "silently different");
    let (checked, _) = fork(
        &disk_write_of(trace, &CHECKING_BLOCK),
        "disk-error",
        "checked",
    );
    assert_verdict(&checked, "handled");
    assert!(
        checked
            .stdout
            .contains("disk_write: write: Input/output error"),
        "{}",
        checked.stdout
    );
}

#[test]
fn a_clock_shift_moves_the_date_by_exactly_that() {
    let _guest = one_guest_at_a_time();
    let recorded: u64 = recording().stdout.lines().next().unwrap().parse().unwrap();
    let (forked, trace) = fork("0", "clock=+3600s", "clock");
    let stdout = fork_stdout(&forked);
    assert_eq!(
        stdout.first(),
        Some(&(recorded + 3600).to_string()),
        "{}",
        forked.stdout
    );
    assert_verdict(&forked, "silently different");
    assert_replay_matches(&trace);
}

#[test]
fn an_entropy_seed_changes_only_the_random_bytes() {
    let _guest = one_guest_at_a_time();
    let recorded: Vec<&str> = recording().stdout.lines().collect();
    let (forked, trace) = fork("0", "entropy=5eed", "entropy");
    let stdout = fork_stdout(&forked);
    assert_eq!(stdout.len(), recorded.len(), "{}", forked.stdout);
    for (line, (was, is)) in recorded.iter().zip(&stdout).enumerate() {
        assert_eq!(line == 1, was != is, "line {line}: {was} / {is}");
    }
    assert_verdict(&forked, "silently different");
    assert_replay_matches(&trace);
}

#[test]
fn bad_fork_requests_are_refused_with_the_fix() {
    let _guest = one_guest_at_a_time();
    let trace = path(&recording().trace);
    let output = common::scratch(module_path!()).join("refused.provm");
    let request = |at: &str, fault: &str, extra: &[&str]| {
        let mut args = vec!["replay", trace, "--fork-at", at, "--inject", fault, "-o"];
        args.push(path(&output));
        args.extend_from_slice(extra);
        provm(&args)
    };
    let refused = |at: &str, fault: &str, status: i32, message: &str| {
        let refused = request(at, fault, &[]);
        assert_eq!(refused.status, status, "{at} {fault}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(message),
            "{at} {fault}: {}",
            refused.stderr
        );
        assert!(!output.exists());
    };
    let failed = common::PROVM_FAILED;
    refused("100000000", "none", failed, "past the end of the trace");
    refused(
        "disk-write:100000",
        "none",
        failed,
        "disk writes, so there is no disk-write:100000",
    );
    // Reads are not logged: that one is known only at the end of a replay.
    refused("disk-read:100000000", "none", failed, "fewer disk reads");
    // The entropy comes with the command: a fork after it cannot change it.
    refused(
        "disk-write:1",
        "entropy=5eed",
        failed,
        "guest takes its entropy with the command",
    );
    refused("0", "disk-eror", 2, "unknown fault \"disk-eror\"");
    refused("0", "clock=3600", 2, "is not a clock shift");
    refused("0", "entropy=xyz", 2, "is not a hex seed");
    refused("disk-write:0", "none", 2, "is not a fork point");

    std::fs::write(&output, "mine").unwrap();
    let exists = request("0", "none", &[]);
    assert_eq!(exists.status, common::PROVM_FAILED, "{}", exists.stderr);
    assert!(
        exists.stderr.contains("exists; pass --force"),
        "{}",
        exists.stderr
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "mine");
}

/// A fork that cannot write its trace is a tool failing (status 4), said
/// with the reason: not a divergence, and not a trace provm cannot replay.
/// The file size limit makes every write past 1 MiB fail (EFBIG; the shell
/// ignores SIGXFSZ, and provm with it).
#[test]
fn a_fork_that_cannot_write_its_trace_is_a_tool_failure() {
    let _guest = one_guest_at_a_time();
    let output = common::scratch(module_path!()).join("unwritable.provm");
    let shell = "trap '' XFSZ; exec \"$@\"";
    let ran = std::process::Command::new("prlimit")
        .args(["--fsize=1048576", "sh", "-c", shell, "sh"])
        .arg(env!("CARGO_BIN_EXE_provm"))
        .args(["replay", path(&recording().trace), "--fork-at", "0"])
        .args(["--inject", "none", "--force", "-o", path(&output)])
        .output()
        .expect("prlimit (util-linux) is needed");
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(common::TOOL_FAILED), "{stderr}");
    assert!(stderr.contains("cannot write the fork's trace"), "{stderr}");
    assert!(!stderr.contains("diverged"), "{stderr}");
    assert!(!output.exists());
}
