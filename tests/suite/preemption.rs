//! Preemption without a PMU (`record --preempt MS`): guest code that goes
//! round a loop it never leaves by itself, without VM exits, is preempted
//! at a kick, and the replay finds the same instruction instance by its
//! state (`provm_vmm::preemption`).
//! On SVM and VMX hosts (the test beds) user code is preempted; PVM stops
//! guest user mode at no breakpoint, so there only the guest kernel is,
//! and these tests check that it says so and that its traces still replay.

use crate::common;

use std::path::{Path, PathBuf};

use common::{assert_replay_matches, images, one_guest_at_a_time, path, provm, Finished};
use provm_cpu_model::Platform;
use provm_trace::events::Event;
use provm_trace::reader::Trace;

/// The quantum: short, so that the test ends soon on the test beds, whose
/// guests run emulated.
const QUANTUM_MS: &str = "5";

fn trace_path(name: &str) -> PathBuf {
    common::trace_path(&common::scratch(module_path!()), name)
}

fn preempts_user_code() -> bool {
    Platform::detect() == Platform::Hardware
}

fn record_preempting(trace: &Path, command: &[&str]) -> Finished {
    let mut args = vec![
        "record",
        "-o",
        path(trace),
        "--preempt",
        QUANTUM_MS,
        "--timeout",
        "600",
        path(&images().tiny_qcow2),
        "--",
    ];
    args.extend_from_slice(command);
    provm(&args)
}

/// The preemptions `trace` logged.
fn preemptions(trace: &Path) -> usize {
    let opened = Trace::open(trace).unwrap();
    let mut events = opened.events().unwrap();
    let mut count = 0;
    while let Some(event) = events.next_event().unwrap() {
        count += usize::from(matches!(event, Event::Preempted { .. }));
    }
    count
}

/// A thread spinning on a flag that another sets, on one vCPU: the
/// recording preempts the spinner, the setter runs, and the trace replays,
/// each preemption found at its pass through the loop. On PVM the spinner
/// is not preempted: the recording warns, naming the host, and is stopped.
#[test]
fn a_thread_spinning_on_a_flag_another_sets_finishes_when_recorded() {
    let _guest = one_guest_at_a_time();
    let trace = trace_path("spin-flag");
    if !preempts_user_code() {
        let warning = "preempts only the guest kernel here";
        let spun = common::record_until_warned(
            &trace,
            &["--preempt", QUANTUM_MS],
            &["/bin/spin_flag"],
            warning,
        );
        assert!(spun.stderr.contains(warning), "{}", spun.stderr);
        return;
    }
    let recorded = record_preempting(&trace, &["/bin/spin_flag"]);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert!(
        recorded.stdout.contains("flag set after the work"),
        "{}",
        recorded.stdout
    );
    assert!(preemptions(&trace) > 0);
    assert_replay_matches(&trace);
}
