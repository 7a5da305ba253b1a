//! End-to-end reproducibility on the real guest, through the provm binary:
//! pinned runs are the same run every time. All runs start from one cached
//! snapshot of the booted guest (the first run boots it).

use crate::common;

use common::{
    assert_replay_matches, event_log_digest, images, one_guest_at_a_time, path, provm, Finished,
};

/// The check: the clock, the entropy and files, in one command.
const CLOCK_ENTROPY_FILES: &str =
    "date; head -c 16 /dev/urandom | sha256sum; tar -cf - /data | sha256sum";

/// `provm run EXTRA... IMAGE -- /bin/sh -c SCRIPT` on the test image.
fn run_shell(extra: &[&str], script: &str) -> Finished {
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[path(&images().tiny_qcow2), "--", "/bin/sh", "-c", script]);
    provm(&args)
}

#[test]
fn pinned_runs_are_the_same_run_and_the_seed_changes_only_the_entropy() {
    let _guest = one_guest_at_a_time();
    let first = run_shell(&["--pinned"], CLOCK_ENTROPY_FILES);
    assert_eq!(first.status, 0, "{}", first.stderr);
    let second = run_shell(&["--pinned"], CLOCK_ENTROPY_FILES);
    assert_eq!(second.status, 0, "{}", second.stderr);
    assert_eq!(first.stdout, second.stdout);
    assert_eq!(event_log_digest(&first), event_log_digest(&second));
    assert!(
        first.stdout.starts_with("Sat Jan  1 00:00"),
        "the default epoch is 2000-01-01: {}",
        first.stdout
    );

    let reseeded = run_shell(&["--pinned", "--seed", "5eed"], CLOCK_ENTROPY_FILES);
    assert_eq!(reseeded.status, 0, "{}", reseeded.stderr);
    let lines = |finished: &Finished| -> Vec<String> {
        finished.stdout.lines().map(str::to_owned).collect()
    };
    let (pinned, reseeded_lines) = (lines(&first), lines(&reseeded));
    assert_eq!(pinned.len(), 3, "{}", first.stdout);
    assert_eq!(pinned[0], reseeded_lines[0], "the date");
    assert_ne!(pinned[1], reseeded_lines[1], "the random line");
    assert_eq!(pinned[2], reseeded_lines[2], "the tar of /data");
    assert_ne!(event_log_digest(&first), event_log_digest(&reseeded));
}

#[test]
fn a_pinned_recording_is_the_pinned_run_and_replays() {
    let _guest = one_guest_at_a_time();
    let script = "date +%s; sleep 1; date +%s; head -c 8 /dev/urandom | od -An -tx1";
    let epoch = ["--pinned", "--epoch", "2024-02-29T12:00:00Z"];
    let ran = run_shell(&epoch, script);
    assert_eq!(ran.status, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.starts_with("1709208000\n1709208001\n"),
        "{}",
        ran.stdout
    );

    let trace = common::scratch(module_path!()).join("pinned.provm");
    let mut args = vec!["record", "-o", path(&trace)];
    args.extend_from_slice(&epoch);
    args.extend_from_slice(&[path(&images().tiny_qcow2), "--", "/bin/sh", "-c", script]);
    let recorded = provm(&args);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(recorded.stdout, ran.stdout);
    assert_eq!(event_log_digest(&recorded), event_log_digest(&ran));
    assert_replay_matches(&trace);
    let inspect = provm(&["inspect", path(&trace)]);
    assert!(
        inspect.stdout.contains(event_log_digest(&ran)),
        "{}",
        inspect.stdout
    );
}

/// A chaos seed draws the pinned clock's step per VM exit (rr's chaos mode
/// varies its timeslices so): seeds 1 and 2 give 13.75 and 6.25 µs for the
/// default 10. The step is the least time between two clock reads in the
/// log, where some reads are one exit apart. Without it a seed varied only
/// the vCPU schedule, and on some booted snapshots every seed gave the
/// same race count (docs/smp.md).
#[test]
fn a_chaos_seed_draws_the_pinned_clock_step_and_replays() {
    let _guest = one_guest_at_a_time();
    let dir = common::scratch(module_path!());
    for (seed, step_ns) in [(None, 10_000), (Some("1"), 13_750), (Some("2"), 6_250)] {
        let trace = dir.join(format!("chaos-step-{}.provm", seed.unwrap_or("none")));
        let mut args = vec!["record", "-o", path(&trace), "--pinned"];
        if let Some(seed) = seed {
            args.extend(["--chaos", seed]);
        }
        args.extend([path(&images().tiny_qcow2), "--", "cat", "/proc/uptime"]);
        let recorded = provm(&args);
        assert_eq!(recorded.status, 0, "seed {seed:?}: {}", recorded.stderr);
        let least = provm(&[
            "query",
            "--format",
            "csv",
            path(&trace),
            "SELECT MIN(apart) FROM (SELECT guest_ns - LAG(guest_ns) OVER (ORDER BY idx) AS apart \
             FROM events WHERE kind = 'clock') WHERE apart > 0",
        ]);
        assert_eq!(least.status, 0, "{}", least.stderr);
        assert_eq!(
            least.stdout.lines().nth(1),
            Some(step_ns.to_string().as_str()),
            "seed {seed:?}: {}",
            least.stdout
        );
        if seed.is_some() {
            assert_replay_matches(&trace);
        }
    }
}

#[test]
fn a_bad_seed_epoch_or_run_count_is_refused_naming_the_fix() {
    let image = path(&images().tiny_qcow2);
    for (args, expected) in [
        (
            vec!["run", "--pinned", "--seed", "xyz"],
            "give up to 64 hex digits",
        ),
        (
            vec!["record", "--pinned", "--seed", "12g"],
            "'g' is not a hex digit",
        ),
        (
            vec!["run", "--pinned", "--epoch", "2000-13-01T00:00:00Z"],
            "month 13",
        ),
        (
            vec!["repro", "--pinned", "--epoch", "yesterday"],
            "RFC 3339",
        ),
        (vec!["run", "--seed", "1"], "--pinned"),
        (vec!["repro", "--runs", "1"], "2 or more"),
    ] {
        let mut command = args.clone();
        command.extend_from_slice(&[image, "--", "true"]);
        let refused = provm(&command);
        assert_ne!(refused.status, 0, "{args:?}");
        assert!(
            refused.stderr.contains(expected),
            "{args:?}: {}",
            refused.stderr
        );
    }
}

/// `provm repro EXTRA... IMAGE -- /bin/sh -c SCRIPT` on the test image.
fn repro_shell(extra: &[&str], script: &str) -> Finished {
    let mut args = vec!["repro"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[path(&images().tiny_qcow2), "--", "/bin/sh", "-c", script]);
    provm(&args)
}

#[test]
fn repro_names_the_one_source_of_variation() {
    let _guest = one_guest_at_a_time();
    let clock = "; cause: clock (stable when the clock is pinned); not: entropy\n";
    let entropy = "; cause: entropy (stable when the entropy is pinned); not: clock\n";
    // Each verdict: two runs, and one more with each input pinned.
    for (script, what_differs, cause) in [
        (
            "head -c8 /dev/urandom | od -An -tx1",
            "irreproducible: stdout differs",
            entropy,
        ),
        (
            // Fresh files: their times are in the archive.
            "mkdir /out && cd /out && echo a > a && echo b > b && tar -cf result.tar a b && echo done",
            "irreproducible: /out/result.tar differs (written by tar, pid ",
            clock,
        ),
    ] {
        let repro = repro_shell(&[], script);
        assert_eq!(repro.status, 1, "{script}: {}{}", repro.stdout, repro.stderr);
        assert!(
            repro.stdout.starts_with(what_differs) && repro.stdout.ends_with(cause),
            "{script}: {}",
            repro.stdout
        );
    }
    let echo = repro_shell(&[], "echo hi");
    assert_eq!(echo.status, 0, "{}{}", echo.stdout, echo.stderr);
    assert!(
        echo.stdout
            .starts_with("reproducible: 2 runs with the clock and entropy varied"),
        "{}",
        echo.stdout
    );
}

#[test]
fn a_pinned_repro_is_always_reproducible() {
    let _guest = one_guest_at_a_time();
    let repro = repro_shell(&["--pinned", "--runs", "3"], CLOCK_ENTROPY_FILES);
    assert_eq!(repro.status, 0, "{}{}", repro.stdout, repro.stderr);
    assert!(
        repro
            .stdout
            .starts_with("reproducible: 3 runs with every input pinned"),
        "{}",
        repro.stdout
    );
}
