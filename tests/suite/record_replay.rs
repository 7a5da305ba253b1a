//! End-to-end record and replay on the real guest, through the provm
//! binary: every workload replays exactly, a damaged trace or a different
//! image is refused, and a run cut short leaves a trace that replays to
//! where it stopped. All recordings start from one cached snapshot of the
//! booted guest (the first record boots it).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{
    assert_replay_matches, images, one_guest_at_a_time, path, provm, provm_with_env, record_shell,
    Finished, PROVM_FAILED, RECORD_WORKLOADS, REPLAY_CUT_SHORT,
};
use provm_cpu_model::Platform;
use provm_trace::events::Event;
use provm_trace::format;
use provm_trace::manifest::InterruptDelivery;
use provm_trace::reader::Trace;

fn record(trace: &Path, extra: &[&str], script: &str) -> Finished {
    record_shell(&images().tiny_qcow2, trace, extra, script)
}

fn trace_path(name: &str) -> PathBuf {
    common::trace_path(&common::scratch(module_path!()), name)
}

/// The workloads one after another in one recording, each after a marker
/// line: one replay checks them all (a guest session each would cost a
/// record and a replay more per workload, seconds each where guest ring 0
/// is emulated or the whole machine is, as on PVM and the SVM test bed).
#[test]
fn every_workload_replays_exactly() {
    let _guest = one_guest_at_a_time();
    let marker = |index: usize| format!("== workload {index}");
    let script = RECORD_WORKLOADS
        .iter()
        .enumerate()
        .map(|(index, (_, script))| format!("echo '{}'; {script}", marker(index)))
        .collect::<Vec<_>>()
        .join("; ");
    let trace = trace_path("workloads");
    let recorded = record(&trace, &[], &script);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    for (index, (name, _)) in RECORD_WORKLOADS.iter().enumerate() {
        let printed = recorded
            .stdout
            .split(&format!("{}\n", marker(index)))
            .nth(1)
            .and_then(|rest| rest.split("== workload ").next())
            .unwrap_or_else(|| panic!("{name}: no marker in {}", recorded.stdout));
        assert!(!printed.is_empty(), "{name} printed nothing");
    }
    assert_replay_matches(&trace);
}

#[test]
fn damaged_traces_and_other_images_are_refused() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("damage");
    assert_eq!(
        record(&trace, &[], "echo data > /tmp/x; cat /tmp/x").status,
        0
    );
    let inspect = provm(&["inspect", path(&trace)]);
    assert_eq!(inspect.status, 0, "{}", inspect.stderr);
    assert!(
        inspect.stdout.contains("status     complete"),
        "{}",
        inspect.stdout
    );
    assert!(inspect.stdout.contains("agent input"), "{}", inspect.stdout);

    let bytes = fs::read(&trace).unwrap();
    let damaged = |name: &str, bytes: &[u8], expected: &str| {
        let copy = trace_path(name);
        fs::write(&copy, bytes).unwrap();
        for command in ["replay", "inspect"] {
            let refused = provm(&[command, path(&copy)]);
            assert_eq!(refused.status, PROVM_FAILED, "{name}: {}", refused.stdout);
            assert!(
                refused.stderr.contains(expected),
                "{name}: {}",
                refused.stderr
            );
        }
    };
    for at in [20, bytes.len() / 3, bytes.len() / 2, bytes.len() - 10] {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x40;
        damaged("flipped", &flipped, "corrupt");
    }
    damaged("truncated", &bytes[..bytes.len() * 2 / 3], "truncated");
    // Not damage: replay refuses a newer format, inspect shows what it can.
    let mut future = bytes.clone();
    future[..format::HEADER_LEN].copy_from_slice(&format::header(99));
    let future_trace = trace_path("future");
    fs::write(&future_trace, &future).unwrap();
    let refused = provm(&["replay", path(&future_trace)]);
    assert_eq!(refused.status, PROVM_FAILED, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("use a newer provm"),
        "{}",
        refused.stderr
    );
    let inspected = provm(&["inspect", path(&future_trace)]);
    assert_eq!(inspected.status, 0, "{}", inspected.stderr);
    assert!(
        inspected.stdout.contains("use a newer provm"),
        "{}",
        inspected.stdout
    );

    let missing = common::scratch(module_path!()).join("no-such.provm");
    for command in ["replay", "inspect"] {
        let refused = provm(&[command, path(&missing)]);
        assert_eq!(refused.status, PROVM_FAILED);
        assert!(refused.stderr.contains("cannot read"), "{}", refused.stderr);
    }

    let mut other = fs::read(&images().tiny_qcow2).unwrap();
    let last = other.len() - 1;
    other[last] ^= 1;
    let other_image = common::scratch(module_path!()).join("modified.qcow2");
    fs::write(&other_image, other).unwrap();
    let refused = provm(&["replay", "--image", path(&other_image), path(&trace)]);
    assert_eq!(refused.status, PROVM_FAILED);
    assert!(
        refused.stderr.contains("the image, ")
            && refused
                .stderr
                .contains("is not the file the trace was recorded with"),
        "{}",
        refused.stderr
    );
}

/// `record --prov` keeps the provenance in the trace, where `provm graph`
/// finds it, and the capture replays like any other guest work.
#[test]
fn a_recording_keeps_its_provenance() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("provenance");
    let document = common::scratch(module_path!()).join("recorded.prov");
    let script = "cd /tmp; echo pear > in.txt; sort in.txt > out.txt";
    let recorded = record(&trace, &["--prov", path(&document)], script);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let graph = provm(&["graph", path(&trace), "--inputs-of", "/tmp/out.txt"]);
    assert_eq!(graph.status, 0, "{}", graph.stderr);
    assert!(graph.stdout.contains("/tmp/in.txt"), "{}", graph.stdout);
    assert_replay_matches(&trace);

    // Without --prov, `provm graph` derives it from a replay.
    let without = trace_path("no-provenance");
    let script = "cd /tmp; echo fig > in.txt; sort in.txt > out.txt";
    assert_eq!(record(&without, &[], script).status, 0);
    let derived = provm(&["graph", path(&without), "--inputs-of", "/tmp/out.txt"]);
    assert_eq!(derived.status, 0, "{}", derived.stderr);
    assert!(
        derived.stderr.contains("deriving its provenance"),
        "{}",
        derived.stderr
    );
    assert!(derived.stdout.contains("/tmp/in.txt"), "{}", derived.stdout);
}

/// User-mode RDTSC. The guest kernel sets CR4.TSD and answers the fault
/// from the VMM's logged clock (kernel patch 0009): where the host honours
/// TSD (VMX, SVM) the value is an input like any other and the replay
/// matches. PVM runs user mode natively with the host's CR4, so there it is
/// host time never logged: a known hole, detected, as the replay reports
/// where the printed value differs.
#[test]
fn user_mode_rdtsc_replays_where_the_host_honours_tsd_and_diverges_on_pvm() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("host-tsc");
    assert_eq!(record(&trace, &[], "host_tsc").status, 0);
    let inspected = provm(&["inspect", path(&trace)]).stdout;
    assert_eq!(
        inspected.contains("  user-rdtsc: "),
        Platform::detect() == Platform::Pvm,
        "{inspected}"
    );
    let replay = provm(&["replay", path(&trace)]);
    if Platform::detect() == Platform::Hardware {
        assert_eq!(replay.status, 0, "{}{}", replay.stdout, replay.stderr);
        assert!(
            replay.stdout.starts_with("replay matched: "),
            "{}",
            replay.stdout
        );
        return;
    }
    assert_eq!(replay.status, 1, "{}{}", replay.stdout, replay.stderr);
    for part in [
        "replay diverged at event",
        "expected: agent output",
        "actual:   agent output",
        "guest RIP",
    ] {
        assert!(replay.stdout.contains(part), "{part}: {}", replay.stdout);
    }
}

/// The interrupt-window exits and doorbell rings in `trace`'s log.
fn window_and_doorbell_exits(trace: &Path) -> (usize, usize) {
    let opened = Trace::open(trace).unwrap();
    let (mut windows, mut doorbells) = (0, 0);
    let mut events = opened.events().unwrap();
    while let Some(event) = events.next_event().unwrap() {
        match event {
            Event::InterruptWindow { .. } => windows += 1,
            Event::PioWrite { port: 0x440, .. } => doorbells += 1,
            _ => {}
        }
    }
    (windows, doorbells)
}

/// A tick due while the guest kernel has interrupts off waits for the
/// guest to enable them: at the guest kernel's doorbell exit (port 0x440)
/// on every host, an exit the guest's own execution places, so that the
/// trace replays wherever KVM would place its interrupt-window exit. A
/// recording that waited at window exits instead (provm's on SVM and VMX
/// before; `PROVM_RECORD_DELIVERY=window` makes one) replays by running to
/// each logged window on SVM and VMX, and is refused up front on PVM,
/// which stops guest user mode at no breakpoint.
#[test]
fn a_held_interrupt_waits_for_the_doorbell_and_window_recordings_replay_at_their_logged_places() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("held-interrupts");
    // Disk writes, whose kernel paths turn interrupts off and on again.
    let busy = "dd if=/dev/zero of=/tmp/f bs=64k count=16 2>/dev/null; sync; echo done";
    assert_eq!(record(&trace, &[], busy).status, 0);
    let opened = Trace::open(&trace).unwrap();
    // What a diverged replay's spin limit follows.
    assert!(opened
        .outcome
        .longest_exitless_seconds
        .is_some_and(|seconds| seconds > 0.0 && seconds < opened.outcome.host_seconds));
    assert_eq!(
        opened.manifest.interrupt_delivery,
        InterruptDelivery::Doorbell
    );
    let (windows, doorbells) = window_and_doorbell_exits(&trace);
    assert_eq!(windows, 0, "an interrupt-window exit was recorded");
    assert!(doorbells > 0, "no doorbell exit was recorded");
    // The verdict names what the recording host left unlogged: on PVM
    // user-mode RDTSC among others, on SVM and VMX never that.
    let verdict = assert_replay_matches(&trace);
    let pvm = Platform::detect() == Platform::Pvm;
    assert_eq!(verdict.contains("\n  user-rdtsc: "), pvm, "{verdict}");
    // On any host a CPU with RDRAND runs it for a program that ignores CPUID.
    assert_eq!(
        verdict.contains("not checked"),
        pvm || provm_engine::holes::host_has_rdrand(),
        "{verdict}"
    );

    let windowed = trace_path("held-interrupts-at-windows");
    let mut args = vec!["record", "-o", path(&windowed), path(&images().tiny_qcow2)];
    args.extend_from_slice(&["--", "/bin/sh", "-c", busy]);
    let recorded = provm_with_env(&args, &[("PROVM_RECORD_DELIVERY", Path::new("window"))]);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let delivery = Trace::open(&windowed).unwrap().manifest.interrupt_delivery;
    assert_eq!(delivery, InterruptDelivery::WindowExit);
    let (windows, doorbells) = window_and_doorbell_exits(&windowed);
    eprintln!("at window exits: {windows} window exits, {doorbells} doorbell exits");
    assert!(windows > 0, "no interrupt-window exit was recorded");
    assert_eq!(doorbells, 0, "the doorbell rang in a window recording");
    if pvm {
        let refused = provm(&["replay", path(&windowed)]);
        assert_eq!(
            refused.status, PROVM_FAILED,
            "{}{}",
            refused.stdout, refused.stderr
        );
        assert!(
            refused
                .stderr
                .contains("stops guest user mode at no breakpoint"),
            "{}",
            refused.stderr
        );
    } else {
        assert_replay_matches(&windowed);
    }
}

#[test]
/// Guest user code computing without exits is a normal workload: the
/// recording warns (the rest of the guest waits) and goes on, here until
/// Ctrl-C, sent when the warning comes, which leaves a trace that replays
/// to where it stopped. The interrupt follows the warning, not a time
/// limit: a time limit measured against the host's speed came first on a
/// busy SVM test bed (Linux 6.12), before the loop had run for 3 s.
fn a_computing_guest_is_warned_about_and_its_cut_trace_replays_to_the_stop() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("spin");
    let warning = "guest user code has computed for ";
    let spun = common::record_until_warned(
        &trace,
        &[],
        &["/bin/sh", "-c", "echo spinning; while :; do :; done"],
        warning,
    );
    assert_eq!(spun.status, PROVM_FAILED, "{}", spun.stderr);
    // The warning comes at the first kick past the limit that finds user
    // code running: 3 s in, or later if the kernel ran (working) then.
    for part in [
        warning,
        " s without a VM exit",
        "interrupted (Ctrl-C",
        "marked incomplete",
    ] {
        assert!(spun.stderr.contains(part), "{part}: {}", spun.stderr);
    }
    assert!(provm(&["inspect", path(&trace)])
        .stdout
        .contains("INCOMPLETE"));
    // Matched as far as the log goes, which is not a full match: status 3.
    let replayed = provm(&["replay", path(&trace)]);
    assert_eq!(
        replayed.status, REPLAY_CUT_SHORT,
        "{}{}",
        replayed.stdout, replayed.stderr
    );
    assert!(
        replayed
            .stdout
            .starts_with("replay matched up to where the recording was cut short"),
        "{}",
        replayed.stdout
    );
}

/// A recording killed with SIGKILL (a container engine's time limit, a
/// lost node) finishes nothing: its unfinished file is all it leaves, and
/// `provm recover` makes of it a trace cut short that replays to its last
/// event chunk written whole.
#[test]
fn a_killed_recording_is_recovered_and_replays_to_where_it_was_killed() {
    let _guest = one_guest_at_a_time();
    let dir = common::scratch(module_path!()).join("killed");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("run.provm");
    let killed = common::provm_signalled_at(
        &[
            "record",
            "-o",
            path(&trace),
            "--timeout",
            "600",
            path(&images().tiny_qcow2),
            "--",
            "/bin/sh",
            "-c",
            common::SERIAL_LINES_FOR_EVER,
        ],
        libc::SIGKILL,
        "200 lines",
    );
    assert_eq!(killed.status, -1, "killed by a signal: {}", killed.stderr);
    assert!(!trace.exists());
    let partials: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".partial"))
        .collect();
    let [partial] = partials.as_slice() else {
        panic!("one unfinished file: {partials:?}")
    };
    let unfinished = provm(&["replay", path(partial)]);
    assert!(
        unfinished.stderr.contains("`provm recover`"),
        "{}",
        unfinished.stderr
    );
    // Never over an existing trace without --force.
    fs::write(&trace, "mine").unwrap();
    let refused = provm(&["recover", path(partial)]);
    assert_ne!(refused.status, 0);
    assert_eq!(fs::read(&trace).unwrap(), b"mine");
    fs::remove_file(&trace).unwrap();

    let recovered = provm(&["recover", path(partial)]);
    assert_eq!(recovered.status, 0, "{}", recovered.stderr);
    assert!(
        recovered
            .stderr
            .contains("cut short where the recording was killed"),
        "{}",
        recovered.stderr
    );
    assert!(
        !partial.exists(),
        "the unfinished file stays once recovered"
    );
    // A file not named as an unfinished one needs -o, and is left as it is.
    let finished = fs::read(&trace).unwrap();
    let not_partial = provm(&["recover", path(&trace)]);
    assert_ne!(not_partial.status, 0);
    assert!(
        not_partial
            .stderr
            .contains("give the trace to write with -o"),
        "{}",
        not_partial.stderr
    );
    assert_eq!(fs::read(&trace).unwrap(), finished);
    let inspected = provm(&["inspect", path(&trace)]);
    assert!(
        inspected.stdout.contains("INCOMPLETE"),
        "{}",
        inspected.stdout
    );
    let replayed = provm(&["replay", path(&trace)]);
    assert_eq!(
        replayed.status, REPLAY_CUT_SHORT,
        "{}{}",
        replayed.stdout, replayed.stderr
    );
    // Every event the recovered log kept was replayed.
    let events = Trace::open(&trace).unwrap().outcome.events;
    assert!(events > 0);
    assert!(
        replayed.stdout.starts_with(&format!(
            "replay matched up to where the recording was cut short: {events} events"
        )),
        "{}",
        replayed.stdout
    );
}

/// A guest kernel that works for long without a VM exit is not spinning:
/// the exit of a process that touched 16 MiB unmaps it in one system call,
/// which takes the emulated kernel on PVM seconds (7.9 s for 32 MiB), past
/// the limit set here (provm at e181262 stopped such a kernel as spinning,
/// exit 125; the 800 MB took over 60 s, the default limit), and
/// the recording goes on to a clean end, then replays. A kernel going round
/// the same states is still stopped (`vmm/src/spin_watch.rs`'s tests).
#[test]
fn a_kernel_freeing_a_large_mapping_is_working_not_spinning() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("free-large");
    let recorded = record(&trace, &["--exitless-limit", "1"], "free_large 16");
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(recorded.stdout, "touched 16 MiB\n");
    assert!(!recorded.stderr.contains("spinning"), "{}", recorded.stderr);
    let longest = Trace::open(&trace)
        .unwrap()
        .outcome
        .longest_exitless_seconds
        .unwrap();
    eprintln!("longest stretch without an exit: {longest:.1} s");
    if Platform::detect() == Platform::Pvm {
        // Long enough that the old rule (time since the last exit) stopped it.
        assert!(longest > 1.0, "{longest}");
    }
    assert_replay_matches(&trace);
}

/// `record --cpu x86-64-v2` where a baseline can be presented (VMX/SVM):
/// the guest sees the baseline's features and no more, and the trace
/// replays matched. On PVM, whose guest user space reads the host's own
/// CPUID, the recording is refused before anything is written, saying so.
#[test]
fn a_baseline_recording_replays_or_is_refused_on_pvm() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("baseline-x86-64-v2");
    let _ = fs::remove_file(&trace);
    let recorded = record(
        &trace,
        &["--cpu", "x86-64-v2"],
        "grep -m1 flags /proc/cpuinfo",
    );
    if Platform::detect() == Platform::Pvm {
        assert_eq!(recorded.status, PROVM_FAILED, "{}", recorded.stdout);
        for expected in [
            "--cpu x86-64-v2 cannot be presented on PVM",
            "guest user space runs natively",
            "lacks cx16, popcnt",
        ] {
            assert!(recorded.stderr.contains(expected), "{}", recorded.stderr);
        }
        assert!(!trace.exists());
        return;
    }
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let flags: Vec<&str> = recorded.stdout.split_whitespace().collect();
    for v2 in ["cx16", "popcnt", "sse4_2", "ssse3", "lahf_lm"] {
        assert!(flags.contains(&v2), "{v2}: {}", recorded.stdout);
    }
    for beyond in ["avx", "avx2", "bmi1", "svm", "vmx", "rdrand"] {
        assert!(!flags.contains(&beyond), "{beyond}: {}", recorded.stdout);
    }
    let inspect = provm(&["inspect", path(&trace)]);
    assert!(
        inspect.stdout.contains("cpu        x86-64-v2 ("),
        "{}",
        inspect.stdout
    );
    assert_replay_matches(&trace);
}
