//! State checks end to end, on the real guest: a replay compares the
//! guest's memory at the recording's checks and the whole machine at its
//! power-off, so an unlogged input whose effect stays inside the guest is a
//! divergence, not a match; an ordinary workload still matches, and
//! `provm inspect` counts the checks.

use crate::common;

use std::path::{Path, PathBuf};

use common::{
    assert_replay_matches, images, log_events, one_guest_at_a_time, path, provm, provm_with_env,
    trace_path, Finished, RECORD_WORKLOADS,
};
use provm_trace::reader::Trace;

/// `provm record` of `script` on the test image, checking memory every
/// `interval` events (the internal switch; unset, provm's own interval).
fn record(name: &str, interval: Option<&str>, script: &str) -> (std::path::PathBuf, Finished) {
    let trace = trace_path(&common::scratch(module_path!()), name);
    let args = [
        "record",
        "-o",
        path(&trace),
        path(&images().tiny_qcow2),
        "--",
        "/bin/sh",
        "-c",
        script,
    ];
    let env: Vec<(&str, &Path)> = interval
        .map(|events| ("PROVM_STATE_CHECKS", Path::new(events)))
        .into_iter()
        .collect();
    let recorded = provm_with_env(&args, &env);
    assert_eq!(recorded.status, 0, "{name}: {}", recorded.stderr);
    (trace, recorded)
}

/// The `state` line of `provm inspect`.
fn inspected_checks(trace: &Path) -> String {
    let inspect = provm(&["inspect", path(trace)]);
    assert_eq!(inspect.status, 0, "{}", inspect.stderr);
    inspect
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("state      "))
        .unwrap_or_else(|| panic!("no state line in: {}", inspect.stdout))
        .to_owned()
}

/// User-mode RDTSC written to a tmpfs file, nothing printed: every output
/// the log compares is the same whatever the value. Where the host traps
/// RDTSC (SVM, VMX: the guest kernel answers it from the logged clock) it
/// is an input like any other and the replay matches. On PVM it runs
/// natively, unlogged (the manifest's hole "user-rdtsc"): only the guest's
/// memory differs, and the state check must say so, and where: the page
/// of /dev/shm/tsc, the hole that fits it, and (`--explain`) the process
/// that wrote it.
#[test]
fn user_rdtsc_kept_in_tmpfs_is_caught_by_the_state_check() {
    let _guest = one_guest_at_a_time();
    let (trace, recorded) = record("tsc-in-tmpfs", None, "host_tsc > /dev/shm/tsc");
    assert_eq!(recorded.stdout, "");
    let holes = Trace::open(&trace).unwrap().manifest.holes.unwrap();
    let replay = provm(&["replay", "--explain", path(&trace)]);
    if !holes.iter().any(|hole| hole == "user-rdtsc") {
        assert_eq!(replay.status, 0, "{}{}", replay.stdout, replay.stderr);
        assert!(
            replay.stdout.starts_with("replay matched: ") && replay.stdout.contains("state check"),
            "{}",
            replay.stdout
        );
        return;
    }
    assert_eq!(replay.status, 1, "{}{}", replay.stdout, replay.stderr);
    let events = Trace::open(&trace).unwrap().outcome.events;
    for part in [
        "replay diverged at event".to_owned(),
        format!("actual:   state check at event {events}: memory differs"),
        "memory differs in 1 page:".to_owned(),
        "owner: the file /tsc on tmpfs, at offset 0x0".to_owned(),
        "hole: user-rdtsc: the page holds this host's time-stamp counter as the replay read it (in decimal".to_owned(),
        "the file /tsc was written by: pid ".to_owned(),
        "host_tsc) as /dev/shm/tsc".to_owned(),
    ] {
        assert!(replay.stdout.contains(&part), "{part}: {}", replay.stdout);
    }
    let json = provm(&["replay", "--format", "json", path(&trace)]);
    let verdict: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(verdict["verdict"], "diverged", "{}", json.stdout);
    let page = &verdict["explanation"]["memory"]["pages"][0];
    assert_eq!(page["owner"]["kernel"]["path"], "/tsc", "{}", json.stdout);
}

/// User-mode RDTSC kept on a process's stack while it reads the clock
/// (VM exits), checking memory every 50 events: the replay names the first
/// periodic check whose memory differs, before the end, with the process
/// running there (tsc_kept, built with frame pointers: its backtrace runs
/// from read_clock to main, in its file) and its stack's page as the page
/// that differs.
#[test]
fn a_periodic_check_names_the_first_event_and_the_process_running() {
    let _guest = one_guest_at_a_time();
    let (trace, _) = record("tsc-on-stack-periodic", Some("50"), "tsc_kept 300");
    let recorded = Trace::open(&trace).unwrap();
    let replay = provm(&["replay", path(&trace)]);
    if !recorded
        .manifest
        .holes
        .unwrap()
        .iter()
        .any(|h| h == "user-rdtsc")
    {
        assert_eq!(replay.status, 0, "{}{}", replay.stdout, replay.stderr);
        return;
    }
    assert_eq!(replay.status, 1, "{}{}", replay.stdout, replay.stderr);
    let event = replay
        .stdout
        .split("actual:   state check at event ")
        .nth(1)
        .and_then(|rest| rest.split(':').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no state check divergence in: {}", replay.stdout));
    assert!(event < recorded.outcome.events, "{}", replay.stdout);
    for part in [
        "expected: state check: memory digest",
        "memory differs in 1 page:",
        " (tsc_kept, parent ",
        "its user-space backtrace (by frame pointers):",
        "#0 0x",
        "#1 0x",
        " in file /bin/tsc_kept+0x",
        "(tsc_kept) at 0x",
        " (stack)",
    ] {
        assert!(replay.stdout.contains(part), "{part}: {}", replay.stdout);
    }
    let json = provm(&["replay", "--format", "json", path(&trace)]);
    let verdict: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let explanation = &verdict["explanation"];
    assert_eq!(
        explanation["process"]["comm"], "tsc_kept",
        "{}",
        json.stdout
    );
    assert_eq!(
        explanation["backtrace"][1]["region"]["file"]["path"], "/bin/tsc_kept",
        "{}",
        json.stdout
    );
    assert_eq!(
        explanation["memory"]["pages"][0]["owner"]["mapped_by"][0]["region"], "stack",
        "{}",
        json.stdout
    );
    let state = provm(&["inspect", "--state", path(&trace)]);
    assert_eq!(state.status, 0, "{}", state.stderr);
    let periodic = state
        .stdout
        .lines()
        .filter(|line| line.starts_with("event ") && line.ends_with(" pages digested"))
        .count();
    assert!(periodic >= 1, "{}", state.stdout);
}

/// An ordinary workload replays matched with state checks taken at a short
/// interval, and at the end, and `provm inspect` counts them. (The test
/// beds run this one: what the checks read differs by host.)
#[test]
fn an_ordinary_workload_matches_with_state_checks() {
    let _guest = one_guest_at_a_time();
    let (_, script) = RECORD_WORKLOADS[0];
    let (trace, _) = record("checked-often", Some("300"), script);
    let checks = inspected_checks(&trace);
    let periodic: u64 = checks
        .split("memory at ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{checks}"));
    assert!(periodic >= 2, "{checks}");
    let replayed = assert_replay_matches(&trace);
    assert!(
        replayed.contains(&format!("{} state checks", periodic + 1)),
        "{replayed}"
    );
}

/// At the default interval the same workload gets one check, at the
/// guest's power-off; with checks switched off the trace is like an older
/// provm's: matched, "state not checked".
#[test]
fn state_checks_at_the_default_interval_and_switched_off() {
    let _guest = one_guest_at_a_time();
    let (_, script) = RECORD_WORKLOADS[0];
    let (trace, _) = record("checked-default", None, script);
    let replayed = assert_replay_matches(&trace);
    assert!(replayed.contains(", 1 state check"), "{replayed}");
    assert!(
        inspected_checks(&trace)
            .contains("1 state check: memory, registers and 8 devices at the guest's power-off"),
        "{}",
        inspected_checks(&trace)
    );

    let (trace, _) = record("unchecked", Some("off"), script);
    assert!(inspected_checks(&trace).starts_with("not checked"));
    let replayed = assert_replay_matches(&trace);
    assert!(replayed.contains("state not checked"), "{replayed}");
}

/// The guest-physical page of the kernel's first text page: vmlinux's
/// first segment is loaded at its physical address (LOAD_PHYSICAL_ADDR).
const KERNEL_TEXT_PAGE: u64 = 0x100_0000;

/// A copy of `trace` named `name`, its outcome (JSON) and its page
/// digests changed by `outcome` and `pages`; whether each changed
/// anything.
fn altered(
    trace: &Path,
    name: &str,
    outcome: impl Fn(&mut serde_json::Value) -> bool,
    pages: impl Fn(&mut Vec<provm_trace::page_digests::PageDigests>) -> bool,
) -> (PathBuf, (bool, bool)) {
    use provm_trace::format::SectionKind;
    use provm_trace::page_digests;

    let copy = trace.with_file_name(name);
    let mut changed = (false, false);
    common::rewrite_trace(trace, &copy, |kind, payload| match kind {
        SectionKind::Outcome => {
            let mut json: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            changed.0 = outcome(&mut json);
            serde_json::to_vec(&json).unwrap()
        }
        SectionKind::PageDigests => {
            let mut checks = page_digests::decode(&payload).unwrap();
            changed.1 = pages(&mut checks);
            checks.iter().flat_map(page_digests::encode_check).collect()
        }
        _ => payload,
    });
    (copy, changed)
}

/// The recorded final check's digest `field` (a JSON pointer) with its
/// lowest bit flipped.
fn flip_digest(outcome: &mut serde_json::Value, field: &str) -> bool {
    let Some(digest) = outcome.pointer_mut(field) else {
        return false;
    };
    let value = u64::from_str_radix(digest.as_str().unwrap(), 16).unwrap();
    *digest = format!("{:016x}", value ^ 1).into();
    true
}

/// One byte of one page made to differ, by script, on every host kind:
/// the recorded final check's memory digest and one piece digest of the
/// kernel's first text page are changed in the trace, as a byte flipped in
/// that piece would change them. The replay (whose memory is the
/// recording's) names that page, that piece and the page's owner. Then an
/// MSR made to differ likewise, its value and the register digest: the
/// replay names the MSR with both values.
#[test]
fn a_page_or_a_register_made_to_differ_is_named() {
    use provm_trace::page_digests::{CheckPoint, PAGE_SIZE, PIECES_PER_PAGE};

    let _guest = one_guest_at_a_time();
    let (trace, _) = record("to-flip", None, "echo flipped");
    let piece = (KERNEL_TEXT_PAGE as usize / PAGE_SIZE) * PIECES_PER_PAGE + 3;
    let (flipped, changed) = altered(
        &trace,
        "flipped.provm",
        |outcome| flip_digest(outcome, "/state_check/memory"),
        |checks| {
            let mut changed = false;
            for check in checks.iter_mut().filter(|c| c.at == CheckPoint::PowerOff) {
                check.pieces[piece] ^= 1;
                changed = true;
            }
            changed
        },
    );
    assert_eq!(
        changed,
        (true, true),
        "the trace has a final check and its page digests"
    );

    let replay = provm(&["replay", "--explain", path(&flipped)]);
    assert_eq!(replay.status, 1, "{}{}", replay.stdout, replay.stderr);
    for part in [
        "memory differs in 1 page:".to_owned(),
        format!("page {KERNEL_TEXT_PAGE:#x}, first difference in bytes +0x300..+0x400"),
        "owner: the kernel's image, at ".to_owned(),
    ] {
        assert!(replay.stdout.contains(&part), "{part}: {}", replay.stdout);
    }

    // The first MSR the check compares, its value one more.
    let (msr, value) = {
        let recorded = Trace::open(&trace).unwrap();
        let parts = recorded.outcome.state_check.unwrap().register_parts;
        let (name, hex) = parts
            .into_iter()
            .find(|(name, _)| name.starts_with("MSR "))
            .unwrap();
        (name, u64::from_str_radix(&hex, 16).unwrap())
    };
    let (changed_msr, changed) = altered(
        &trace,
        "msr-changed.provm",
        |outcome| {
            outcome["state_check"]["register_parts"][&msr] = format!("{:016x}", value + 1).into();
            flip_digest(outcome, "/state_check/registers")
        },
        |_| false,
    );
    assert!(changed.0);
    let replay = provm(&["replay", path(&changed_msr)]);
    assert_eq!(replay.status, 1, "{}{}", replay.stdout, replay.stderr);
    let named = format!(
        "state check at event {}: registers differ: {msr} (recorded {:#x}, replayed {value:#x})",
        log_events(&trace),
        value + 1
    );
    assert!(replay.stdout.contains(&named), "{named}: {}", replay.stdout);
}
