//! Preemption without a PMU (`record --preempt MS`): guest code that
//! computes without VM exits is preempted at a kick, and the replay finds
//! the same instruction instance by its state (`provm_vmm::preemption`):
//! a loop it never leaves by itself searched from the last exit, a
//! computation that ends after a free run (`preemption::late_arming`).
//! Loops that never end by themselves are preempted on every host, in
//! user code too: on PVM, which stops guest user mode at no breakpoint,
//! the replay finds them with `int3`s (`provm_vmm::user_trap`).
//! Computations that end are preempted where a breakpoint stops user mode
//! (SVM and VMX hosts, the test beds); on PVM these tests check that the
//! recording says so. `provm run`, which nothing replays, preempts user
//! code on every host.

use crate::common;

use std::path::{Path, PathBuf};

use common::{
    assert_replay_matches, images, one_guest_at_a_time, path, provm, provm_with_env, Finished,
};
use provm_cpu_model::Platform;
use provm_trace::events::Event;
use provm_trace::reader::Trace;

/// The quantum: short, so that the test ends soon on the test beds, whose
/// guests run emulated.
const QUANTUM_MS: &str = "5";

fn trace_path(name: &str) -> PathBuf {
    common::trace_path(&common::scratch(module_path!()), name)
}

/// Whether the recorder preempts computations in user code that end by
/// themselves (`--preempt-computations`): where a breakpoint stops user
/// mode, not on PVM. Loops that never end are preempted everywhere.
fn preempts_computations() -> bool {
    Platform::detect() == Platform::Hardware
}

/// Records `command` with `--preempt`, and `options` (before the image).
fn record_preempting(trace: &Path, options: &[&str], command: &[&str]) -> Finished {
    let mut args = vec![
        "record",
        "-o",
        path(trace),
        "--preempt",
        QUANTUM_MS,
        "--timeout",
        "600",
    ];
    args.extend_from_slice(options);
    args.extend_from_slice(&[path(&images().tiny_qcow2), "--"]);
    args.extend_from_slice(command);
    provm(&args)
}

/// The preemptions `trace` logged: of loops that never end, and timed
/// ones (of computations that may end).
fn preemptions(trace: &Path) -> (usize, usize) {
    let opened = Trace::open(trace).unwrap();
    let mut events = opened.events().unwrap();
    let (mut loops, mut timed) = (0, 0);
    while let Some(event) = events.next_event().unwrap() {
        match event {
            Event::Preempted { ran_ns: None, .. } => loops += 1,
            Event::Preempted {
                ran_ns: Some(_), ..
            } => timed += 1,
            _ => {}
        }
    }
    (loops, timed)
}

/// Records `command` with `--preempt` and `options` where this host
/// preempts computations in user code. On PVM, which preempts only loops
/// that never end there, the program that waits for another to run
/// waits for ever: records until the warning that names the host,
/// asserts it came, and returns None.
fn record_preempting_computations(
    trace: &Path,
    options: &[&str],
    command: &[&str],
) -> Option<Finished> {
    if preempts_computations() {
        return Some(record_preempting(trace, options, command));
    }
    let warning = "preempts here only loops that never end by themselves";
    let waited = common::record_until_warned(
        trace,
        &[options, &["--preempt", QUANTUM_MS]].concat(),
        command,
        warning,
    );
    assert!(waited.stderr.contains(warning), "{}", waited.stderr);
    None
}

/// spin_flag recorded as `name` with `options`: the recording preempts
/// the spinner, in user mode, the setter runs, and the trace replays, each
/// preemption found at its pass through the loop (on PVM with `int3`s).
fn spin_flag_ends_and_replays(name: &str, options: &[&str]) {
    let trace = trace_path(name);
    let recorded = record_preempting(&trace, options, &["/bin/spin_flag"]);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert!(
        recorded.stdout.contains("flag set after the work"),
        "{}",
        recorded.stdout
    );
    let (loops, timed) = preemptions(&trace);
    assert!(loops + timed > 0);
    assert!(in_user_mode(&trace) > 0, "no preemption in user mode");
    assert_replay_matches(&trace);
}

/// How many of the trace's preemptions came in user mode.
fn in_user_mode(trace: &Path) -> usize {
    let opened = Trace::open(trace).unwrap();
    let mut events = opened.events().unwrap();
    let mut count = 0;
    while let Some(event) = events.next_event().unwrap() {
        if let Event::Preempted {
            user_code: Some(_), ..
        } = event
        {
            count += 1;
        }
    }
    count
}

/// A thread spinning on a flag that another sets, on one vCPU: the
/// recording preempts the spinner, the setter runs, and the trace
/// replays.
#[test]
fn a_thread_spinning_on_a_flag_another_sets_finishes_when_recorded() {
    let _guest = one_guest_at_a_time();
    spin_flag_ends_and_replays("spin-flag", &[]);
}

/// The spinning thread and the one that sets its flag on two vCPUs, which
/// a recording runs one at a time: the spinning vCPU is preempted and
/// gives way to the other, whose thread then sets the flag, and the trace
/// replays. With a chaos seed, which draws the quanta of preemption as
/// well as the vCPU schedule.
#[test]
fn a_vcpu_spinning_in_user_space_gives_way_to_the_other_when_recorded() {
    let _guest = one_guest_at_a_time();
    spin_flag_ends_and_replays("spin-flag-two-vcpus", &["--cpus", "2", "--chaos", "7"]);
}

/// How far each counter of tests/data/two_counters.c counts at least, in
/// its long passes (a few thousand instructions each, whose registers
/// repeat): a late search's stops come a pass apart, so that the test
/// bed's emulated CPU makes few (the tight loop's cost is measured in
/// docs/recording.md). Each goes on counting until the other has begun,
/// so the first is preempted in its computation however fast the host:
/// on the bed 1,000 passes made as many preemptions as 3,000 and 10,000
/// (35, 32 and 32 found after a free run), in 22, 25 and 37 s.
const COUNT: u64 = 1_000;

/// How far each counter saw the other when it ended, from the lines
/// "counter X done, Y at N" (in the order printed, which need not be the
/// order they ended in).
fn counts_seen(stdout: &str) -> Vec<u64> {
    let seen: Vec<u64> = stdout
        .lines()
        .filter(|line| line.starts_with("counter "))
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(seen.len(), 2, "{stdout}");
    seen
}

/// The replay's count of preemptions found after a free run, from its
/// debug log (`vm/late_arming.rs`); asserts it matched.
fn found_after_a_free_run(trace: &Path) -> u64 {
    let replay = provm_with_env(
        &["replay", path(trace)],
        &[("PROVM_LOG", Path::new("provm_vmm=debug"))],
    );
    assert_eq!(replay.status, 0, "{}{}", replay.stdout, replay.stderr);
    assert!(
        replay.stdout.starts_with("replay matched: "),
        "{}",
        replay.stdout
    );
    let rollbacks = replay.stderr.matches("late arming: rolled back").count();
    let found = replay
        .stderr
        .matches("late arming: preemption found after a free run")
        .count();
    eprintln!("replay: {found} preemptions found after a free run, {rollbacks} rollbacks");
    found as u64
}

/// Two processes counting without system calls, on one vCPU, each until
/// the other has begun: where user code stops at breakpoints,
/// `--preempt-computations` preempts their computations, which end, so
/// the guest's ticks come, the two interleave (the first to end saw the
/// other begun) and the recording ends; the replay matches, finding
/// preemptions after a free run, and a replay that takes them a pass
/// late, the registers the same and a counter one more, diverges. On PVM only loops that never end are
/// preempted: the first counter waits for ever, and the recording warns,
/// naming the host.
#[test]
fn two_counting_processes_interleave_when_recorded_and_replay_after_a_free_run() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("two-counters");
    let count = COUNT.to_string();
    let command = ["/bin/two_counters", &count, "long"];
    let Some(recorded) =
        record_preempting_computations(&trace, &["--preempt-computations"], &command)
    else {
        return;
    };
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let seen = counts_seen(&recorded.stdout);
    let (_, timed) = preemptions(&trace);
    // Each ends only once the other has begun: the first to end was
    // preempted for the other before it ended.
    assert!(
        seen.iter().all(|&saw| saw > 0),
        "the counters did not interleave ({timed} preemptions of computations): {}",
        recorded.stdout
    );
    assert!(timed > 0);
    assert!(found_after_a_free_run(&trace) > 0);
    // The preemptions taken one pass late, where only the counter in
    // memory differs: the replay must say it diverged.
    let late = provm_with_env(
        &["replay", path(&trace)],
        &[("PROVM_REPLAY_PREEMPTION_ONE_PASS_LATE", Path::new("1"))],
    );
    assert!(late.stderr.contains("one pass late"), "{}", late.stderr);
    assert_eq!(late.status, 1, "{}{}", late.stdout, late.stderr);
    assert!(
        late.stdout.starts_with("replay diverged"),
        "{}",
        late.stdout
    );
}

/// `provm run` preempts guest user code anywhere, on every host: on PVM,
/// whose guest kernel cannot save user mode's vector state, the VMM keeps
/// it for the kernel (patch 0011), which then switches processes at any
/// tick too, not only at system calls. Two processes counting without
/// system calls, each until the other has begun, end having seen each
/// other part-way; a thread spinning on a flag another sets finishes. Run
/// where the kernel switches only at system calls, the first counter and
/// the spinner wait for ever (the recordings above on PVM).
#[test]
fn user_code_is_preempted_when_run() {
    let _guest = one_guest_at_a_time();
    let image = path(&images().tiny_qcow2);
    let count = COUNT.to_string();
    let run = |command: &[&str]| {
        let ran = provm(&[&["run", "--timeout", "300", image, "--"], command].concat());
        assert_eq!(ran.status, 0, "{}{}", ran.stdout, ran.stderr);
        ran.stdout
    };
    let counted = run(&["/bin/two_counters", &count, "long"]);
    assert!(
        counts_seen(&counted).iter().all(|&saw| saw > 0),
        "{counted}"
    );
    let spun = run(&["/bin/spin_flag"]);
    assert!(spun.contains("flag set after the work"), "{spun}");
}

/// How far each of tests/data/python_threads.py's two threads counts.
const PYTHON_COUNT: u64 = 3_000_000;

/// What the first Python thread to end saw of the other.
fn python_thread_saw(stdout: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|line| line.starts_with("the first to end"));
    let seen = line.and_then(|line| line.rsplit(' ').next()?.parse().ok());
    seen.unwrap_or_else(|| panic!("no count in: {stdout}"))
}

/// A pure-Python program with two CPU-bound threads (the held-out suite's
/// kind): `provm run` interleaves them on every host, the first to end
/// having seen the other part-way. Recorded where user code is preempted
/// (SVM, VMX: `--preempt-computations`) they interleave too; on PVM, whose
/// recordings switch processes only at system calls, they run one after
/// the other. Either way the recording ends and replays.
#[test]
fn two_python_threads_interleave_when_run_and_their_recording_replays() {
    let _guest = one_guest_at_a_time();
    let image = path(common::debian_image());
    let script = std::fs::read_to_string(common::test_data("python_threads.py")).unwrap();
    let count = PYTHON_COUNT.to_string();
    let command = ["python3", "-c", &script, &count];
    let ran = provm(&[&["run", "--timeout", "600", image, "--"][..], &command].concat());
    assert_eq!(ran.status, 0, "{}{}", ran.stdout, ran.stderr);
    let seen = python_thread_saw(&ran.stdout);
    assert!(0 < seen && seen < PYTHON_COUNT, "{}", ran.stdout);

    let trace = trace_path("python-threads");
    let preempting = ["--preempt", QUANTUM_MS, "--preempt-computations"];
    let options: &[&str] = if preempts_computations() {
        &preempting
    } else {
        &[]
    };
    let recorded = provm(
        &[
            &["record", "-o", path(&trace), "--timeout", "600"][..],
            options,
            &[image, "--"],
            &command,
        ]
        .concat(),
    );
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let seen = python_thread_saw(&recorded.stdout);
    if preempts_computations() {
        assert!(0 < seen && seen < PYTHON_COUNT, "{}", recorded.stdout);
    }
    assert_replay_matches(&trace);
}

/// `--preempt-computations` without `--preempt` (which gives the quantum)
/// is refused, naming the missing option, before anything is written.
#[test]
fn preempting_computations_without_a_quantum_is_refused() {
    let trace = trace_path("no-quantum");
    let refused = provm(&[
        "record",
        "-o",
        path(&trace),
        "--preempt-computations",
        path(&images().tiny_qcow2),
        "--",
        "true",
    ]);
    assert_eq!(refused.status, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--preempt <MS>"),
        "{}",
        refused.stderr
    );
    assert!(!trace.exists());
}
