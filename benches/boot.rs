//! Boot and command latency: provm on KVM against QEMU's software emulation
//! (TCG) as the reference, same kernel, initramfs, image and agent protocol.
//! Run by benches/bench.sh; prints one table.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

// Shared with the record/replay bench; this one boots QEMU without it.
#[allow(dead_code)]
mod qemu;

use std::time::{Duration, Instant};

use provm::run::RunOptions;
use provm::session::GuestSession;
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

fn main() {
    let image = &common::images().tiny_qcow2;
    let options = RunOptions::new(image.clone(), Vec::new());
    let job = |script: &str| common::shell_job(&options, script);

    let prepared = provm::run::prepare(&options).unwrap();
    let config = prepared
        .vm_config(
            Arc::new(LiveSeam::starting_at(0)),
            provm::run::overlay_location(&options),
            None,
        )
        .unwrap();
    let machine = qemu::Machine::new(&prepared.boot, prepared.memory_mib, image);
    let (mut guest, provm_boot) =
        GuestSession::boot(config, &prepared.boot, Instant::now() + options.timeout).unwrap();
    let provm_times: Vec<Duration> = WORKLOADS
        .iter()
        .map(|(_, script)| {
            let start = Instant::now();
            guest
                .run(job(script), &mut Vec::new(), &mut Vec::new())
                .unwrap();
            start.elapsed()
        })
        .collect();
    guest.power_off().unwrap();
    // Fast start: the same guest restored from its snapshot (cached by the
    // first call, timed on the second).
    let restore = || {
        let start = Instant::now();
        let mut guest =
            provm::run::start(&options, &prepared, Instant::now() + options.timeout).unwrap();
        let elapsed = start.elapsed();
        guest.power_off().unwrap();
        elapsed
    };
    restore();
    let provm_restore = restore();

    let mut qemu = machine.boot(qemu::Rr::Off);
    let qemu_times: Vec<Duration> = WORKLOADS
        .iter()
        .map(|(_, script)| {
            let start = Instant::now();
            qemu.run(job(script));
            start.elapsed()
        })
        .collect();
    let qemu_boot = qemu.boot_time;
    qemu.power_off();

    println!("| measurement | provm (KVM) | QEMU TCG | provm / TCG |");
    println!("|---|---|---|---|");
    row("boot to agent ready", provm_boot, qemu_boot);
    row(
        "provm: restore the booted snapshot instead (QEMU: boot)",
        provm_restore,
        qemu_boot,
    );
    for (((name, _), provm), qemu) in WORKLOADS.iter().zip(provm_times).zip(qemu_times) {
        row(name, provm, qemu);
    }
}

fn row(name: &str, provm: Duration, qemu: Duration) {
    println!(
        "| {name} | {:.3} s | {:.3} s | {:.2} |",
        provm.as_secs_f64(),
        qemu.as_secs_f64(),
        provm.as_secs_f64() / qemu.as_secs_f64()
    );
}
