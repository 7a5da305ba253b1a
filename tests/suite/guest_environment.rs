//! The guest runs what researchers run, recorded and replayed exactly:
//! what a container runtime mounts (/dev/shm, /dev/pts, /dev/mqueue, a
//! tmpfs /run), System V IPC, TCP over the loopback interface, and Python's
//! multiprocessing in a real Debian userland.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use common::{
    assert_replay_matches, debian_image, images, one_guest_at_a_time, record_shell, trace_path,
};

#[test]
fn ipc_and_loopback_tcp_record_and_replay() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path(&common::scratch(module_path!()), "ipc");
    let script = "grep -E ' /dev/(shm|pts|mqueue) ' /proc/mounts | cut -d' ' -f2,3; \
                  sysv_shm && tcp_echo";
    let recorded = record_shell(&images().tiny_qcow2, &trace, &[], script);
    assert_eq!(recorded.status, 0, "{}{}", recorded.stdout, recorded.stderr);
    for line in [
        "/dev/shm tmpfs",
        "/dev/pts devpts",
        "/dev/mqueue mqueue",
        "sysv shm: written by the child",
        "tcp echo 127.0.0.1: hello over loopback",
        "tcp echo ::1: hello over loopback",
    ] {
        assert!(
            recorded.stdout.contains(line),
            "{line}: {}",
            recorded.stdout
        );
    }
    assert_replay_matches(&trace);
}

#[test]
fn python_multiprocessing_pool_records_and_replays() {
    let image = debian_image();
    let _guest = one_guest_at_a_time();
    let trace = trace_path(&common::scratch(module_path!()), "multiprocessing");
    let script = "python3 -c 'from multiprocessing import Pool\n\
                  with Pool(2) as pool: print(\"pool:\", sum(pool.map(abs, range(-100, 100))))'; \
                  grep -c ' /run tmpfs' /proc/mounts";
    let recorded = record_shell(image, &trace, &[], script);
    assert_eq!(recorded.status, 0, "{}{}", recorded.stdout, recorded.stderr);
    assert_eq!(recorded.stdout, "pool: 10000\n1\n", "{}", recorded.stderr);
    // On PVM its final state check once found two pages that differed:
    // ld.so's data of exited processes, holding the TSC they had read
    // (user-mode RDTSC, unlogged there), until the guest kernel was told
    // to zero freed memory (`holes::kernel_args`).
    assert_replay_matches(&trace);
}

/// A dynamically linked program reads the TSC at its start (glibc's
/// ld.so times itself); on PVM that is unlogged (the hole "user-rdtsc"),
/// and while the program lives its pages hold the values: a periodic
/// check (every 3,000 events here) then differs, and the replay names the
/// process's page that holds this host's TSC and the hole. Where RDTSC is
/// trapped (SVM, VMX) the replay matches.
#[test]
fn a_live_program_s_unlogged_tsc_is_named_at_a_periodic_check() {
    let image = debian_image();
    let _guest = one_guest_at_a_time();
    let trace = trace_path(&common::scratch(module_path!()), "live-tsc");
    let args = [
        "record",
        "-o",
        trace.to_str().unwrap(),
        image.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        "print(sum(range(10**6)))",
    ];
    let recorded = common::provm_with_env(&args, &[("PROVM_STATE_CHECKS", Path::new("3000"))]);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let holes = provm_trace::reader::Trace::open(&trace)
        .unwrap()
        .manifest
        .holes
        .unwrap_or_default();
    if !holes.iter().any(|hole| hole == "user-rdtsc") {
        assert_replay_matches(&trace);
        return;
    }
    let replay = common::provm(&["replay", trace.to_str().unwrap()]);
    assert_eq!(replay.status, 1, "{}{}", replay.stdout, replay.stderr);
    for part in [
        "expected: state check: memory digest",
        "(python3) at 0x7",
        "hole: user-rdtsc: the page holds this host's time-stamp counter as the replay read it (as a 64-bit value",
    ] {
        assert!(replay.stdout.contains(part), "{part}: {}", replay.stdout);
    }
}

/// The guest's wall clock is the host's at each job, even in a guest
/// restored from a snapshot cached long before.
#[test]
fn the_guest_tells_the_hosts_time_and_replays_it() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path(&common::scratch(module_path!()), "wall-clock");
    let image = images().tiny_qcow2.to_str().unwrap();
    let mut recording = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args([
            "record",
            "-o",
            trace.to_str().unwrap(),
            image,
            "--",
            "date",
            "+%s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The output streams back as the guest writes it: the host's time when
    // the line arrives bounds the guest's from above.
    let mut line = String::new();
    BufReader::new(recording.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let host = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(recording.wait().unwrap().success());
    let guest: f64 = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    // `date +%s` drops the fraction: up to a second more.
    let behind = host - guest;
    assert!((0.0..3.0).contains(&behind), "guest {guest}, host {host}");
    assert_replay_matches(&trace);
}

/// Time passes inside a recording while the guest computes without VM
/// exits: its clock reads the VMM's clock (kernel patch 0007), not jiffies
/// that only a delivered tick advances.
#[test]
fn a_computation_timed_inside_a_recording_takes_its_host_time() {
    // The very binary the test image holds, run on the host too.
    let host_binary = common::test_program("timed_loop");
    let milliseconds = |output: &str| -> f64 {
        let first = output.split_whitespace().next();
        first
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{output:?}"))
    };
    // The host's own time for the loop, before and after: the machine may
    // be busy, and the guest shares it.
    let on_host = || {
        let host = Command::new(&host_binary).output().unwrap();
        milliseconds(&String::from_utf8_lossy(&host.stdout))
    };
    let before = on_host();

    let _guest = one_guest_at_a_time();
    let trace = trace_path(&common::scratch(module_path!()), "timed-loop");
    let recorded = record_shell(&images().tiny_qcow2, &trace, &[], "timed_loop");
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let in_guest = milliseconds(&recorded.stdout);
    let after = on_host();
    let (fastest, slowest) = (before.min(after), before.max(after));
    assert!(
        0.6 * fastest <= in_guest && in_guest <= 1.4 * slowest,
        "the loop took {before} and {after} ms on the host, {in_guest} ms by the recorded guest's clock"
    );
    assert_replay_matches(&trace);
}

/// A due timer interrupt reaches the guest when it enables interrupts again,
/// even if every exit it makes is taken with interrupts off (the console's).
#[test]
fn a_program_waiting_for_sigalrm_while_printing_gets_it_when_recorded() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path(&common::scratch(module_path!()), "alarm");
    let recorded = record_shell(
        &images().tiny_qcow2,
        &trace,
        &["--timeout", "300"],
        "alarm_progress",
    );
    assert_eq!(recorded.status, 0, "{}{}", recorded.stdout, recorded.stderr);
    let last = recorded.stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("alarm after "), "{last}");
    assert_replay_matches(&trace);
}
