//! QEMU as the benches' reference: the guest provm boots (same kernel,
//! initramfs, image and agent protocol) under qemu-system-x86_64 -M
//! microvm, with KVM (the peer) or software emulation (TCG), and under TCG
//! optionally with QEMU's own record/replay.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use provm_guest_agent::{FrameReader, GuestMessage, HostMessage, Job};
use provm_vmm::vm::BootSource;

/// How long the agent channel may stay silent before the guest counts as hung.
const SILENCE_LIMIT: Duration = Duration::from_secs(600);

/// What the guest kernel prints last, once the agent has powered it off:
/// microvm without ACPI cannot power off, so QEMU stays up until told.
const HALTED: &str = "reboot: System halted";

/// How QEMU runs the guest's instructions.
#[derive(Clone, Copy)]
pub enum Accel {
    /// Software emulation.
    Tcg,
    /// KVM, with the machine provm presents: no LAPIC (the PIC reaches the
    /// CPU directly), the kernel's irqchip off, none of KVM's paravirtual
    /// features, and the kernel arguments provm adds on this host (on PVM,
    /// `noxsave` among them: its ring-0 emulator cannot run XRSTOR, and
    /// QEMU stops with an emulation failure), so the same kernel boots the
    /// same way.
    Kvm,
}

/// QEMU's record/replay mode (`-icount ...,rr=`) and its log.
#[derive(Clone, Copy)]
pub enum Rr<'a> {
    Off,
    Record(&'a Path),
    Replay(&'a Path),
}

/// Everything a QEMU boot needs, kept across boots.
pub struct Machine {
    kernel: PathBuf,
    initrd: PathBuf,
    /// provm's kernel command line for this machine (its root among them).
    cmdline: String,
    image: PathBuf,
    memory_mib: u64,
    dir: tempfile::TempDir,
}

impl Machine {
    /// The machine provm would boot from `boot` (its kernel, initramfs and
    /// command line) with `memory_mib`, with `image` as the disk.
    pub fn new(boot: &BootSource, memory_mib: u64, image: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let initrd = dir.path().join("initramfs.cpio");
        std::fs::write(&initrd, &boot.initramfs).unwrap();
        Machine {
            kernel: boot.kernel.clone(),
            initrd,
            cmdline: boot.cmdline.clone(),
            image: image.to_owned(),
            memory_mib,
            dir,
        }
    }

    /// provm's kernel command line, with what this host's KVM needs.
    fn kernel_args(&self, accel: Accel) -> String {
        let args = self.cmdline.clone();
        match accel {
            Accel::Tcg => args,
            Accel::Kvm => {
                let probe = provm_vmm::cpu_probe::probe_cpu(provm_cpu_model::Baseline::Host)
                    .expect("KVM is usable");
                format!("{args} {}", probe.kernel_args)
            }
        }
    }

    /// Starts QEMU and waits for the agent's Ready. QEMU's record/replay
    /// (`rr` other than `Off`) runs under TCG only.
    pub fn boot(&self, accel: Accel, rr: Rr) -> QemuGuest {
        let socket = self.dir.path().join("agent.sock");
        let start = Instant::now();
        let mut command = Command::new("qemu-system-x86_64");
        command.args(["-M", "microvm,pic=on,pit=on,rtc=on,acpi=off"]);
        match accel {
            // No LAPIC: with `nolapic` the PIC must reach the CPU directly.
            Accel::Tcg => command.args(["-cpu", "qemu64,-apic", "-accel", "tcg"]),
            Accel::Kvm => command.args([
                "-cpu",
                "host,-apic,-x2apic,kvm=off,-kvm-poll-control,-arch-capabilities",
                "-accel",
                "kvm,kernel-irqchip=off",
            ]),
        };
        command
            .args(["-m", &format!("{}M", self.memory_mib)])
            .args(["-nographic", "-nodefaults", "-no-reboot"])
            // The console (ttyS0), read when the guest powers off.
            .args(["-serial", "stdio"])
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&self.initrd)
            .args(["-append", &self.kernel_args(accel)]);
        let direct = format!(
            "if=none,format=qcow2,snapshot=on,file={}",
            self.image.display()
        );
        match rr {
            Rr::Off => command.arg("-drive").arg(format!("{direct},id=disk")),
            Rr::Record(log) | Rr::Replay(log) => {
                let mode = if matches!(rr, Rr::Record(_)) {
                    "record"
                } else {
                    "replay"
                };
                // Disk requests must pass the blkreplay filter so that their
                // completions are logged and replayed at the same instruction.
                command
                    .arg("-icount")
                    .arg(format!("shift=auto,rr={mode},rrfile={}", log.display()))
                    .arg("-drive")
                    .arg(format!("{direct},id=img-direct"))
                    .args([
                        "-drive",
                        "driver=blkreplay,if=none,image=img-direct,id=disk",
                    ])
            }
        };
        let mut child = command
            .args(["-device", "virtio-blk-device,drive=disk"])
            // The agent channel: a virtconsole on the second serial chardev.
            // QEMU 7.2 records the input of chardevs made by -serial but not
            // of those made by -chardev, whose input a replay would then lack.
            // wait=on: the guest starts once the channel is connected, so the
            // agent's Ready cannot be sent into the void.
            .arg("-serial")
            .arg(format!("unix:{},server=on,wait=on", socket.display()))
            .args([
                "-device",
                "virtio-serial-device",
                "-device",
                "virtconsole,chardev=serial1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("qemu-system-x86_64 is needed: run scripts/install-deps");
        let channel = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("QEMU exited before the agent channel opened: {status}");
            }
            match UnixStream::connect(&socket) {
                Ok(stream) => break stream,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        channel.set_read_timeout(Some(SILENCE_LIMIT)).unwrap();
        let console = BufReader::new(child.stdout.take().unwrap());
        let mut guest = QemuGuest {
            child,
            channel,
            console,
            frames: FrameReader::default(),
            boot_time: Duration::ZERO,
        };
        assert_eq!(guest.next_message(), Some(GuestMessage::Ready));
        guest.boot_time = start.elapsed();
        guest
    }
}

/// A booted guest whose agent is waiting for a job.
pub struct QemuGuest {
    child: Child,
    channel: UnixStream,
    console: BufReader<ChildStdout>,
    frames: FrameReader,
    /// From QEMU's start to the agent's Ready.
    pub boot_time: Duration,
}

impl QemuGuest {
    /// Runs `job` and returns the agent's messages up to the one that ends it.
    pub fn run(&mut self, mut job: Job) -> Vec<GuestMessage> {
        // The host's time as the job leaves, as provm's session stamps it:
        // the agent sets the guest's clock from it, and refuses 0.
        job.wall_clock_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        self.channel
            .write_all(&HostMessage::Run(job).encode())
            .unwrap();
        let mut messages = Vec::new();
        loop {
            let message = self.next_message().expect("QEMU closed the agent channel");
            let last = matches!(message, GuestMessage::Finished(_) | GuestMessage::Failed(_));
            messages.push(message);
            if last {
                return messages;
            }
        }
    }

    /// Powers the guest off and ends QEMU; returns the whole console.
    pub fn power_off(mut self) -> String {
        self.channel
            .write_all(&HostMessage::PowerOff.encode())
            .unwrap();
        let mut console = String::new();
        while !console.contains(HALTED) {
            let read = self.console.read_line(&mut console).unwrap();
            assert!(read > 0, "QEMU ended before the guest halted:\n{console}");
        }
        // SIGTERM, not SIGKILL: QEMU logs the shutdown request in its
        // record/replay log, so a replay ends there and QEMU exits by itself.
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: signals our own child, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        self.finish(console)
    }

    /// Lets a replay run to its end: returns the agent's messages after
    /// Ready and the whole console.
    pub fn replay_to_end(mut self) -> (Vec<GuestMessage>, String) {
        let messages = std::iter::from_fn(|| self.next_message()).collect();
        (messages, self.finish(String::new()))
    }

    /// Reads the console to its end and waits for QEMU's successful exit.
    fn finish(&mut self, mut console: String) -> String {
        self.console.read_to_string(&mut console).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "QEMU failed ({status}):\n{console}");
        console
    }

    /// The next message from the agent; None once QEMU closes the channel.
    fn next_message(&mut self) -> Option<GuestMessage> {
        loop {
            if let Some((kind, payload)) = self.frames.next_frame().unwrap() {
                return Some(GuestMessage::decode(kind, &payload).unwrap());
            }
            let mut buffer = [0u8; 65536];
            let n = self
                .channel
                .read(&mut buffer)
                .expect("the guest under QEMU stopped talking");
            if n == 0 {
                return None;
            }
            self.frames.push(&buffer[..n]);
        }
    }
}

impl Drop for QemuGuest {
    // A bench that fails half-way leaves no QEMU behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
