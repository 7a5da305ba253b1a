//! Every host probe gives one verdict per host: each runs 20 times in one
//! process, with the other core (if any) kept busy, and the test prints the table
//! (`cargo test -p provm-vmm probes::stability -- --nocapture`).
//!
//! A probe whose verdict changed from one run to the next would make a
//! recording or a replay depend on which run won a race: a replay on
//! Linux 6.1 under the SVM test bed was once refused because the
//! interrupt-window probe (`interrupt_window`) lost one. The probes provm
//! decides by must agree every time; the window's placement is reported
//! beside them, as a fact of the host that provm no longer depends on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use kvm_ioctls::Kvm;
use provm_cpu_model::{check::model_only, Baseline};

use super::{breakpoint_step, interrupt_window, port_exit};
use crate::cpu_probe;

const RUNS: usize = 20;

/// The distinct answers among `answers`, each with how often it came.
fn tally(answers: Vec<String>) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for answer in answers {
        match counts.iter_mut().find(|(seen, _)| *seen == answer) {
            Some((_, count)) => *count += 1,
            None => counts.push((answer, 1)),
        }
    }
    counts
}

/// Keeps another core busy until dropped: the probes run under load, as
/// they do beside CI's other lane. Only where there is another core: on a
/// host of one CPU (the VMX test bed's L1 under Bochs) the spinning thread
/// would take turns with the probe's vCPU, which no lane does, and double
/// the test's time there (116 s of the bed's 624 s).
struct Load(Arc<AtomicBool>);

impl Load {
    fn start() -> Option<Self> {
        if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return None;
        }
        let running = Arc::new(AtomicBool::new(true));
        let spinning = Arc::clone(&running);
        thread::spawn(move || {
            while spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        Some(Load(running))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

#[test]
fn every_probe_provm_decides_by_gives_one_verdict_on_this_host() {
    let kvm = Kvm::new().unwrap();
    let load = Load::start();
    let repeated = |probe: &dyn Fn() -> String| tally((0..RUNS).map(|_| probe()).collect());
    let decided = [
        (
            "single-step flag seen by the guest",
            repeated(&|| format!("{:?}", breakpoint_step::probe(&kvm).unwrap())),
        ),
        (
            "RIP at a port-OUT exit",
            repeated(&|| format!("{:?}", port_exit::probe(&kvm).unwrap())),
        ),
        (
            // The model, as the snapshot key and the replay checks take it:
            // the fields KVM fills per vCPU differ by thread on PVM, whose
            // x2APIC ID is the host CPU the probe's thread ran on (two
            // tables, 10 and 10 of 20, when a build kept both cores busy).
            "CPUID model read back, and the kernel arguments it needs",
            repeated(&|| {
                let probe = cpu_probe::probe_cpu(Baseline::Host).unwrap();
                format!("{:x?} {}", model_only(&probe.guest), probe.kernel_args)
            }),
        ),
    ];
    let measured = repeated(&|| {
        match interrupt_window::exact_once(&kvm).unwrap() {
            true => "where the SDM places it",
            false => "elsewhere",
        }
        .to_owned()
    });
    let beside = match load {
        Some(_) => "the other core busy",
        None => "on this host's one CPU",
    };
    eprintln!("probe verdicts in {RUNS} runs, {beside}:");
    for (probe, verdicts) in decided
        .iter()
        .chain([&("interrupt-window exit (measured only)", measured)])
    {
        // The CPUID table is long: its verdicts are told apart by number.
        let shown: Vec<String> = verdicts
            .iter()
            .enumerate()
            .map(|(index, (verdict, count))| match verdict.len() > 60 {
                true => format!("table {}: {count}/{RUNS}", index + 1),
                false => format!("{verdict}: {count}/{RUNS}"),
            })
            .collect();
        eprintln!("  {probe}: {}", shown.join(", "));
    }
    for (probe, verdicts) in &decided {
        assert_eq!(
            verdicts.len(),
            1,
            "{probe} changed its verdict: {verdicts:?}"
        );
    }
}
