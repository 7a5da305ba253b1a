//! Boot and command latency: provm on KVM against QEMU's software emulation
//! (TCG) as the reference, same kernel, initramfs, image and agent protocol.
//! Run by benches/bench.sh; prints one table.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use provm::run::RunOptions;
use provm::session::GuestSession;
use provm_guest_agent::{FrameReader, GuestMessage, HostMessage, Job};
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
    let kernel = prepared.boot.kernel.clone();
    let initramfs = prepared.boot.initramfs.clone();
    let config = prepared
        .vm_config(
            Arc::new(LiveSeam::starting_at(0)),
            provm::run::overlay_location(&options),
            None,
        )
        .unwrap();
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

    let mut qemu = QemuGuest::boot(&kernel, &initramfs, image, options.memory_mib);
    let qemu_times: Vec<Duration> = WORKLOADS
        .iter()
        .map(|(_, script)| qemu.run(job(script)))
        .collect();

    println!("| measurement | provm (KVM) | QEMU TCG | provm / TCG |");
    println!("|---|---|---|---|");
    row("boot to agent ready", provm_boot, qemu.boot_time);
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

/// The same guest under qemu-system-x86_64 -M microvm with TCG, the agent
/// channel on a virtconsole behind a Unix socket.
struct QemuGuest {
    child: Child,
    channel: UnixStream,
    frames: FrameReader,
    boot_time: Duration,
    _dir: tempfile::TempDir,
}

impl QemuGuest {
    fn boot(
        kernel: &std::path::Path,
        initramfs: &[u8],
        image: &std::path::Path,
        memory_mib: u64,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let initrd = dir.path().join("initramfs.cpio");
        std::fs::write(&initrd, initramfs).unwrap();
        let socket = dir.path().join("agent.sock");
        let start = Instant::now();
        let child = Command::new("qemu-system-x86_64")
            .args([
                "-M",
                "microvm,pic=on,pit=on,rtc=on,acpi=off",
                // No LAPIC: with `nolapic` the PIC must reach the CPU directly.
                "-cpu",
                "qemu64,-apic",
                "-accel",
                "tcg",
            ])
            .args(["-m", &format!("{memory_mib}M")])
            .args(["-nographic", "-nodefaults", "-no-reboot", "-serial", "null"])
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", &provm::run::kernel_args(false)])
            .arg("-drive")
            .arg(format!(
                "if=none,id=disk,format=qcow2,snapshot=on,file={}",
                image.display()
            ))
            .args(["-device", "virtio-blk-device,drive=disk"])
            // wait=on: the guest starts once the channel is connected, so the
            // agent's Ready cannot be sent into the void.
            .arg("-chardev")
            .arg(format!(
                "socket,id=agent,server=on,wait=on,path={}",
                socket.display()
            ))
            .args([
                "-device",
                "virtio-serial-device",
                "-device",
                "virtconsole,chardev=agent",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 is needed: run scripts/install-deps");
        let channel = loop {
            match UnixStream::connect(&socket) {
                Ok(stream) => break stream,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut guest = QemuGuest {
            child,
            channel,
            frames: FrameReader::default(),
            boot_time: Duration::ZERO,
            _dir: dir,
        };
        assert_eq!(guest.next_message(), GuestMessage::Ready);
        guest.boot_time = start.elapsed();
        guest
    }

    fn run(&mut self, job: Job) -> Duration {
        let start = Instant::now();
        self.channel
            .write_all(&HostMessage::Run(job).encode())
            .unwrap();
        while !matches!(self.next_message(), GuestMessage::Finished(_)) {}
        start.elapsed()
    }

    fn next_message(&mut self) -> GuestMessage {
        loop {
            if let Some((kind, payload)) = self.frames.next_frame().unwrap() {
                return GuestMessage::decode(kind, &payload).unwrap();
            }
            let mut buffer = [0u8; 65536];
            let n = self.channel.read(&mut buffer).unwrap();
            assert!(n > 0, "QEMU closed the agent channel");
            self.frames.push(&buffer[..n]);
        }
    }
}

impl Drop for QemuGuest {
    // QEMU's microvm does not exit when the guest powers off.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
