//! Boot and command latency: provm on KVM against its peer, QEMU with KVM,
//! and QEMU's software emulation (TCG) as the reference, same kernel,
//! initramfs, image and agent protocol. Run by benches/bench.sh; prints one
//! table of medians of five rounds with their min and max.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

// Shared with the record/replay bench; this one boots QEMU without it.
#[allow(dead_code)]
mod qemu;

use std::time::{Duration, Instant};

use provm_engine::session::GuestSession;
use provm_engine::start::RunOptions;
use provm_guest_agent::{GuestMessage, Outcome};
use provm_vmm::seam::LiveSeam;

/// The workloads timed after boot, each as a shell script.
const WORKLOADS: &[(&str, &str)] = &[
    ("first command (mounts the root): true", "true"),
    ("next command: true", "true"),
    (
        "user-space loop (200k iterations)",
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
    ),
    ("50 fork+exec", "for i in $(seq 50); do /bin/true; done"),
    (
        "write+read 4 MiB file",
        "dd if=/dev/zero of=/tmp/f bs=64k count=64 2>/dev/null && cat /tmp/f > /dev/null",
    ),
];

/// Rounds of each system, alternated so that a slow stretch of a shared
/// host hits all alike.
const ROUNDS: usize = 5;

/// One round's times on one system: the boot, then each workload.
type Round = Vec<Duration>;

fn main() {
    let image = &common::images().tiny_qcow2;
    let options = RunOptions::new(image.clone(), Vec::new());
    let job = |script: &str| common::shell_job(&options, script);
    let prepared = provm_engine::start::prepare(&options).unwrap();
    let machine = qemu::Machine::new(&prepared.boot, prepared.memory_mib, image);

    let provm_round = || -> Round {
        let config = prepared
            .vm_config(
                Arc::new(LiveSeam::starting_at(0)),
                options.overlay_location(),
                None,
            )
            .unwrap();
        let (mut guest, boot) =
            GuestSession::boot(config, &prepared.boot, Instant::now() + options.timeout).unwrap();
        let mut round = vec![boot];
        for (_, script) in WORKLOADS {
            let start = Instant::now();
            guest
                .run(job(script), &mut Vec::new(), &mut Vec::new())
                .unwrap();
            round.push(start.elapsed());
        }
        guest.power_off().unwrap();
        round
    };
    // Fast start: the same guest restored from its snapshot (cached by the
    // first call, not timed).
    let restore = || {
        let start = Instant::now();
        let mut guest = common::start_guest(&options, &prepared);
        let elapsed = start.elapsed();
        guest.power_off().unwrap();
        elapsed
    };
    let qemu_round = |accel: qemu::Accel| -> Round {
        let mut guest = machine.boot(accel, qemu::Rr::Off);
        let mut round = vec![guest.boot_time];
        for (_, script) in WORKLOADS {
            let start = Instant::now();
            let messages = guest.run(job(script));
            round.push(start.elapsed());
            assert!(
                matches!(
                    messages.last(),
                    Some(GuestMessage::Finished(Outcome::Exited(0)))
                ),
                "QEMU's guest did not run {script:?}: {messages:?}"
            );
        }
        guest.power_off();
        round
    };

    restore();
    let (mut provm, mut restores, mut kvm, mut tcg) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        provm.push(provm_round());
        restores.push(restore());
        kvm.push(qemu_round(qemu::Accel::Kvm));
        tcg.push(qemu_round(qemu::Accel::Tcg));
        eprintln!("round {round} done");
    }

    println!("boot and command latency, median (min-max) of {ROUNDS} rounds, seconds");
    println!(
        "| measurement | provm (KVM) | QEMU KVM | QEMU TCG | provm / QEMU KVM | provm / TCG |"
    );
    println!("|---|---|---|---|---|---|");
    let names =
        std::iter::once("boot to agent ready").chain(WORKLOADS.iter().map(|(name, _)| *name));
    for (index, name) in names.enumerate() {
        let column =
            |rounds: &[Round]| Stats::of(rounds.iter().map(|round| round[index]).collect());
        let (ours, peer, software) = (column(&provm), column(&kvm), column(&tcg));
        println!(
            "| {name} | {ours} | {peer} | {software} | {:.2} | {:.2} |",
            ours.median / peer.median,
            ours.median / software.median
        );
    }
    let restore = Stats::of(restores);
    println!("| provm: restore the booted snapshot instead | {restore} | | | | |");
}

/// Median, min and max of some times, in seconds.
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(mut times: Vec<Duration>) -> Self {
        times.sort();
        let seconds = |d: Duration| d.as_secs_f64();
        Stats {
            median: seconds(times[times.len() / 2]),
            min: seconds(times[0]),
            max: seconds(times[times.len() - 1]),
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} ({:.3}-{:.3})", self.median, self.min, self.max)
    }
}
