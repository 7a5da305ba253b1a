//! A booted (or restored) virtual machine and its run loop.
//!
//! Everything the guest receives passes through `Vm::run_once` and
//! `Vm::deliver_interrupts`, on the vCPU thread: port and MMIO reads, device
//! completions, interrupt injections, clock readings. Each is reported to
//! the VM's [`Seam`], which a recorder or replayer implements.

use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_debug_exit_arch, kvm_regs, kvm_sregs};
use kvm_ioctls::{Kvm, VcpuExit, VmFd};
use provm_cpu_model::{self as cpu_model, baseline, hidden};
use provm_cpu_model::{Baseline, BaselineError, CpuidEntry, Platform};
use serde::{Deserialize, Serialize};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use crate::boot::{self, BootError};
use crate::bus::{Bus, BusError};
use crate::devices::apic::{APIC_BASE, APIC_SIZE};
use crate::devices::cmos::{Cmos, CmosState, CMOS_PORT, CMOS_PORT_LEN};
use crate::devices::i8042::{self, I8042};
use crate::devices::paravirt::{
    Doorbell, DoorbellState, ParavirtClock, SmpPorts, SmpRequest, StartBlock, DOORBELL_PORT,
    DOORBELL_PORT_LEN, SMP_PORT, SMP_PORT_LEN,
};
use crate::devices::persist::{InvalidState, Persist};
use crate::devices::pic::{self, Pic, PicIrqLine};
use crate::devices::pit::{Pit, PitState, PIT_PORT, PIT_PORT_LEN};
use crate::devices::serial::{
    ConsoleTail, SerialPort, SerialPortState, COM1_BASE, COM1_IRQ, UART_REGISTERS,
};
use crate::devices::virtio::block::VirtioBlock;
use crate::devices::virtio::console::{ConsoleState, VirtioConsole};
use crate::devices::virtio::mmio::{MmioTransport, TransportState};
use crate::devices::virtio::net::VirtioNet;
use crate::devices::SharedIrqLine;
use crate::disk::Disk;
use crate::exit_timing::{ExitClock, ExitDelay, ExitObserver};
use crate::guest_debug::{self, DebugStop, GuestDebug, GuestDebugError};
use crate::host_core;
use crate::logged_window::{WindowBreakpoint, WindowStop};
use crate::memory::{self, GuestMemory, MemoryError, MemoryImage, MMIO_DEVICE_SIZE, MMIO_START};
use crate::mp_table;
use crate::msr;
use crate::paging::{self, Unmapped};
use crate::probes::breakpoint_step::{self, StepMethod};
use crate::probes::port_exit::{self, OutExitRip};
use crate::scheduler::{Next, Reason};
use crate::seam::{Delivery, Exit, ObservedDisk, Seam};
use crate::spin_watch::SpinWatch;
use crate::state_digest::{self, StateDigest};
use crate::vcpu::{self, Kicker, MmioExit, PioExit, Vcpu, VcpuError, VcpuState};

mod cpus;
#[cfg(test)]
mod fuzz;

/// The SYSCALL instruction's entry point (IA32_LSTAR).
const MSR_LSTAR: u32 = 0xc000_0082;

/// The virtio devices: where each sits and which PIC line it raises.
const BLOCK_MMIO: u64 = MMIO_START;
const BLOCK_IRQ: u8 = 5;
const CONSOLE_MMIO: u64 = MMIO_START + MMIO_DEVICE_SIZE;
const CONSOLE_IRQ: u8 = 6;
/// The paravirtual clock's register page (see `devices::paravirt`).
const CLOCK_MMIO: u64 = MMIO_START + 2 * MMIO_DEVICE_SIZE;
/// The network card, only with `--net` (`VmConfig::net`). IRQ 3 is COM2's,
/// which this machine does not have.
const NET_MMIO: u64 = MMIO_START + 3 * MMIO_DEVICE_SIZE;
const NET_IRQ: u8 = 3;
const PIT_IRQ: u8 = 0;
/// Where x86-64 Linux maps its kernel: addresses from here up are its.
const KERNEL_SPACE: u64 = 0xffff_8000_0000_0000;

/// The name of the device behind I/O port `port` (`none` where no device
/// sits: the guest probed an empty port), for people reading a trace.
pub fn port_device(port: u16) -> &'static str {
    let port = u64::from(port);
    let within = |base: u64, len: u64| (base..base + len).contains(&port);
    // The PIC's three blocks are two ports each (`pic::pio_devices`).
    if [pic::MASTER_PORT, pic::SLAVE_PORT, pic::ELCR_PORT]
        .into_iter()
        .any(|base| within(base, 2))
    {
        "pic"
    } else if within(PIT_PORT, PIT_PORT_LEN) {
        "pit"
    } else if within(CMOS_PORT, CMOS_PORT_LEN) {
        "cmos"
    } else if within(COM1_BASE, UART_REGISTERS) {
        "serial"
    } else if within(DOORBELL_PORT.into(), DOORBELL_PORT_LEN) {
        "doorbell"
    } else if within(SMP_PORT.into(), SMP_PORT_LEN) {
        "smp"
    } else if port == i8042::DATA_PORT || port == i8042::COMMAND_PORT {
        "i8042"
    } else {
        "none"
    }
}

/// Every name `port_device`, `mmio_device` and `exit_device` give: the
/// devices exits are timed and delayed by.
pub const EXIT_DEVICES: &[&str] = &[
    "pic",
    "pit",
    "cmos",
    "serial",
    "doorbell",
    "smp",
    "apic",
    "i8042",
    "virtio-blk",
    "virtio-console",
    "virtio-net",
    "clock",
    "halt",
    "msr",
    "interrupt-window",
    "none",
];

/// The device (or, where none is involved, the reason) of a VM exit.
fn exit_device(exit: &VcpuExit) -> &'static str {
    match exit {
        VcpuExit::IoIn(port, _) | VcpuExit::IoOut(port, _) => port_device(*port),
        VcpuExit::MmioRead(address, _) | VcpuExit::MmioWrite(address, _) => mmio_device(*address),
        VcpuExit::Hlt => "halt",
        VcpuExit::X86Rdmsr(_) => "msr",
        VcpuExit::IrqWindowOpen => "interrupt-window",
        _ => "none",
    }
}

/// The name of the device behind guest-physical MMIO `address`.
pub fn mmio_device(address: u64) -> &'static str {
    let within = |base: u64| (base..base + MMIO_DEVICE_SIZE).contains(&address);
    if within(BLOCK_MMIO) {
        "virtio-blk"
    } else if within(CONSOLE_MMIO) {
        "virtio-console"
    } else if within(CLOCK_MMIO) {
        "clock"
    } else if within(NET_MMIO) {
        "virtio-net"
    } else if (APIC_BASE..APIC_BASE + APIC_SIZE).contains(&address) {
        "apic"
    } else {
        "none"
    }
}

/// What a VM boots: the kernel, its initial root and its arguments.
#[derive(Clone)]
pub struct BootSource {
    pub kernel: PathBuf,
    /// An uncompressed cpio archive, the guest's initial root.
    pub initramfs: Vec<u8>,
    /// Kernel arguments; the VM appends the descriptions of its devices.
    pub cmdline: String,
    /// The CPU model the guest boots with.
    pub cpu: Baseline,
}

/// The machine: everything needed to build a VM, booted or restored.
pub struct VmConfig {
    pub memory_mib: u64,
    /// The guest's one disk, /dev/vda.
    pub disk: Box<dyn Disk>,
    /// Echo the guest console to the host's stderr as it is written.
    pub echo_console: bool,
    /// Where the VM's inputs come from and its outputs go.
    pub seam: Arc<dyn Seam>,
    /// When the seam is not preemptive, the longest the guest may run without
    /// a VM exit while a timer tick waits; `None` for no limit.
    pub exitless_limit: Option<Duration>,
    /// Whether a booted guest gets a network card (its frames cross the
    /// seam). A restored one has the card its snapshot has.
    pub net: bool,
    /// How many vCPUs a booted guest gets (1 to `mp_table::MAX_CPUS`). A
    /// restored one has its snapshot's.
    pub cpus: u8,
}

/// The whole VM at a VM exit, enough to continue it in a new process: the
/// vCPU, every device, the virtual time, and the RAM. The disk is not in
/// it: a snapshot is taken before the guest writes to its disk.
pub struct VmSnapshot {
    pub state: VmState,
    pub memory: MemoryImage,
}

/// Changing it is a new machine version (`crate::machine_version`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    /// The virtual clock's reading when the snapshot was taken.
    pub clock_ns: u64,
    vcpu: VcpuState,
    pic: Pic,
    pit: PitState,
    cmos: CmosState,
    serial: SerialPortState,
    i8042: I8042,
    doorbell: DoorbellState,
    block: TransportState<()>,
    console: TransportState<ConsoleState>,
    /// The network card, in machines that have one (from machine version 2
    /// on, with `--net`); absent, the state is machine version 1's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    net: Option<TransportState<()>>,
    /// The other vCPUs, their APICs and the schedule, in machines with more
    /// than one vCPU (machine version 3); absent, the machine has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpus: Option<cpus::CpusState>,
}

/// " on vCPU n" where the guest has more than one, for messages.
fn on_vcpu(vcpu: Option<usize>) -> String {
    vcpu.map(|n| format!(" on vCPU {n}")).unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("/dev/kvm does not exist: provm needs KVM (load the kvm module, or run on a host with virtualization enabled)")]
    NoKvm,
    #[error("no permission to open /dev/kvm: add your user to the 'kvm' group (then log in again) or run as root")]
    KvmPermission,
    #[error("cannot use KVM: {0}")]
    Kvm(kvm_ioctls::Error),
    #[error("cannot open the kernel {path}: {source}; build it with `provm kernel build`")]
    KernelMissing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    Baseline(#[from] BaselineError),
    #[error("device layout: {0}")]
    Bus(#[from] BusError),
    #[error("virtio device: {0}")]
    Virtio(#[from] crate::devices::virtio::mmio::Error),
    /// Boxed: a snapshot's refusal is rare, and would otherwise double the
    /// size of every `VmError`.
    #[error(transparent)]
    DeviceState(Box<InvalidState>),
    #[error("the guest triple-faulted (KVM shutdown exit) at RIP {rip:#x}")]
    TripleFault { rip: u64 },
    #[error("KVM internal error (suberror {suberror}) at RIP {rip:#x}, code bytes: {code}")]
    Internal {
        suberror: u32,
        rip: u64,
        code: String,
    },
    #[error("KVM could not enter the guest (hardware entry failure reason {0:#x})")]
    FailEntry(u64),
    #[error("unexpected VM exit: {0}")]
    UnexpectedExit(String),
    #[error("the guest halted with nothing that could wake it")]
    Stuck,
    #[error(
        "this host's KVM offers at most {max} vCPUs per VM (KVM_CAP_MAX_VCPUS); asked for {asked}"
    )]
    TooManyVcpus { asked: u8, max: usize },
    #[error("the guest asked to start CPU {0}, which this machine does not have or has started")]
    NoSuchCpu(u32),
    #[error("this machine has no vCPU {0}")]
    NoVcpu(usize),
    #[error("the guest did not finish within the time limit; it was running {} at RIP {rip:#x}", if *.rip >= KERNEL_SPACE { "in its kernel" } else { "in user space" })]
    Timeout { rip: u64 },
    #[error("the guest kernel ran {seconds} s without a VM exit while a timer interrupt was due, and for the last {repeating} s it only went round the same {states} register states, at RIP {rip:#x}{}: it is spinning with interrupts enabled (e.g. waiting for jiffies), and without an exit provm cannot give it the tick reproducibly; raise --exitless-limit if the kernel is really working", on_vcpu(*vcpu))]
    Exitless {
        seconds: u64,
        repeating: u64,
        states: usize,
        rip: u64,
        /// The spinning vCPU, in a guest with more than one.
        vcpu: Option<usize>,
    },
    #[error("stopped: {0}")]
    Stopped(String),

    #[error("cannot route the guest's reads of host-dependent MSRs to the VMM (KVM_CAP_X86_USER_SPACE_MSR / KVM_X86_SET_MSR_FILTER; Linux 5.10 or later): {0}")]
    MsrFilter(kvm_ioctls::Error),

    #[error("KVM_RUN failed: {0}")]
    Run(kvm_ioctls::Error),
    #[error(transparent)]
    GuestDebug(#[from] GuestDebugError),
}

impl VmState {
    /// The CPUID table the snapshotted guest saw.
    pub fn cpuid(&self) -> &[CpuidEntry] {
        &self.vcpu.cpuid
    }

    /// How many vCPUs the snapshotted machine has.
    pub fn vcpu_count(&self) -> usize {
        self.cpus.as_ref().map_or(1, |cpus| cpus.vcpus.len() + 1)
    }
}

impl VmState {
    /// Each device's saved state's digest, by name (`state_digest`).
    fn device_digests(&self) -> Vec<(&'static str, u64)> {
        use state_digest::digest;
        let mut digests = vec![
            ("pic", digest(&self.pic)),
            ("pit", digest(&self.pit)),
            ("cmos", digest(&self.cmos)),
            ("serial", digest(&self.serial)),
            ("i8042", digest(&self.i8042)),
            ("doorbell", digest(&self.doorbell)),
            ("virtio-block", digest(&self.block)),
            ("virtio-console", digest(&self.console)),
        ];
        // Listed only where it exists: a machine without one digests as before.
        if let Some(net) = &self.net {
            digests.push(("virtio-net", digest(net)));
        }
        digests
    }
}

impl From<InvalidState> for VmError {
    fn from(error: InvalidState) -> Self {
        VmError::DeviceState(Box::new(error))
    }
}

/// Why `Vm::run` returned.
#[derive(Debug, PartialEq, Eq)]
pub enum VmEvent {
    /// The guest sent bytes on the agent channel.
    AgentOutput(Vec<u8>),
    /// The guest halted for good (its orderly power-off).
    Halted,
    /// The guest asked for a reset (a reboot, or a kernel panic with panic=-1).
    Reset,
    /// A breakpoint or single-step set with `set_guest_debug` stopped the
    /// guest. Not a VM exit: `run` goes on from there as if never stopped.
    DebugStop(DebugStop),
    /// The seam asked to pause (`Seam::pause_here`) after a VM exit: the VM
    /// may be snapshotted here, and `run` goes on as if never stopped.
    Paused,
}

/// How one entry into the guest ended.
enum Entry {
    /// No exit, nothing to handle: the kick timer interrupted it, or it
    /// stepped over a breakpoint.
    Kicked,
    /// A VM exit, handled; `halted` if it was HLT.
    Exited {
        halted: bool,
    },
    Debug(DebugStop),
}

/// The guest as an observer sees it at a stop: its registers, and its
/// memory through its page tables. Looking is not an input: nothing here
/// changes the guest.
pub struct GuestView<'a> {
    /// Which vCPU's registers these are.
    pub vcpu: usize,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    memory: &'a GuestMemory,
}

impl GuestView<'_> {
    /// Reads guest virtual memory under the current page tables.
    pub fn read(&self, virt: u64, buf: &mut [u8]) -> Result<(), Unmapped> {
        paging::read(self.memory, self.sregs.cr3, virt, buf)
    }

    /// Reads guest virtual memory under the page tables at `cr3`: another
    /// process's memory than the running one's.
    pub fn read_under(&self, cr3: u64, virt: u64, buf: &mut [u8]) -> Result<(), Unmapped> {
        paging::read(self.memory, cr3, virt, buf)
    }
}

pub struct Vm {
    kvm: Kvm,
    _vm: VmFd,
    memory: GuestMemory,
    vcpu: Vcpu,
    kicker: Kicker,
    pio: Bus,
    mmio: Bus,
    pic: Arc<Mutex<Pic>>,
    pit: Arc<Mutex<Pit>>,
    timer_line: SharedIrqLine,
    i8042: Arc<Mutex<I8042>>,
    doorbell: Arc<Mutex<Doorbell>>,
    cmos: Arc<Mutex<Cmos>>,
    serial: Arc<Mutex<SerialPort>>,
    block: Arc<Mutex<MmioTransport<VirtioBlock>>>,
    console: Arc<Mutex<MmioTransport<VirtioConsole>>>,
    net: Option<Arc<Mutex<MmioTransport<VirtioNet>>>>,
    console_tail: ConsoleTail,
    seam: Arc<dyn Seam>,
    /// Where this host's KVM leaves RIP at an OUT exit (see `port_exit`).
    out_exit_rip: OutExitRip,
    exitless_limit: Option<Duration>,
    /// Whether the last KVM_RUN ended in a VM exit (not a kick): the points
    /// at which a non-preemptive VM may inject interrupts.
    at_exit: bool,
    /// When the guest last exited (host time), to notice a spinning guest.
    last_exit: Instant,
    /// Whether the current stretch without exits was reported already.
    exitless_warned: bool,
    /// Where the guest was at the kicks of the current stretch.
    spin_watch: SpinWatch,
    /// The other vCPUs, with more than one (see `cpus`).
    cpus: Option<cpus::Cpus>,
    smp_ports: Arc<Mutex<SmpPorts>>,
    /// What the guest stops at (`set_guest_debug`).
    guest_debug: GuestDebug,
    /// Exit timing, when asked for (`time_exits`).
    exit_clock: Option<ExitClock>,
    /// The guest stopped at a breakpoint and must step over it on re-entry.
    step_over_due: bool,
    /// It is stepping over one, with its breakpoints lifted.
    stepping_over: bool,
    /// How this host single-steps the guest unseen (`breakpoint_step`).
    step_method: StepMethod,
    /// While a step is made with breakpoints: how many of the armed ones
    /// are the debugger's (the rest make the step).
    step_breakpoints: Option<usize>,
    /// The logged interrupt window a replay runs the guest to
    /// (`Delivery::LoggedWindow`).
    window: WindowBreakpoint,
    /// The vCPU's signal timer targets the thread that created the VM.
    _not_send: PhantomData<*const ()>,
}

impl Vm {
    /// Creates the VM, loads the kernel and initramfs, and wires the devices.
    /// The VM must be run on the thread that creates it.
    pub fn new(config: VmConfig, boot: &BootSource) -> Result<Self, VmError> {
        let mut kernel = File::open(&boot.kernel).map_err(|source| VmError::KernelMissing {
            path: boot.kernel.clone(),
            source,
        })?;
        let kvm = open_kvm()?;
        let platform = Platform::detect();
        let model = baseline::guest_model(&vcpu::supported_cpuid(&kvm)?, platform, boot.cpu)?;
        let net = config.net;
        let count = config.cpus;
        let smp = count > 1;
        let max = kvm.get_max_vcpus();
        if usize::from(count) > max {
            return Err(VmError::TooManyVcpus { asked: count, max });
        }
        let boot_cpuid = match smp {
            true => cpus::cpuid_for(&model, 0),
            false => model.clone(),
        };
        let mut vm = Self::build(kvm, config, &boot_cpuid, net)?;
        if smp {
            vm.cpus = Some(cpus::Cpus::create(
                &vm.kvm, &vm._vm, &model, count, &vm.vcpu,
            )?);
            mp_table::write(&vm.memory, count)
                .map_err(|error| BootError::Memory(error.to_string()))?;
        }
        let mut unenforced = hidden::unenforced(&vm.vcpu.cpuid, platform);
        // The APIC the VMM emulates for them is what SMP guests need.
        unenforced.retain(|feature| !smp || feature.name != "apic");
        if !unenforced.is_empty() {
            tracing::debug!(
                count = unenforced.len(),
                "KVM left hidden CPU features visible; the kernel is told to ignore them"
            );
        }
        let mut cmdline = format!(
            "{} {} virtio_mmio.device=4K@{BLOCK_MMIO:#x}:{BLOCK_IRQ} virtio_mmio.device=4K@{CONSOLE_MMIO:#x}:{CONSOLE_IRQ} provm_clock={CLOCK_MMIO:#x}",
            boot.cmdline,
            cpu_model::kernel_args(&unenforced),
        );
        if net {
            cmdline.push_str(&format!(" virtio_mmio.device=4K@{NET_MMIO:#x}:{NET_IRQ}"));
        }
        let entry = boot::load_kernel(&vm.memory, &mut kernel, &boot.initramfs, &cmdline)?;
        vm.vcpu.enter_pvh(entry)?;
        Ok(vm)
    }

    /// Creates the VM in the state `snapshot` was taken in. `config` must
    /// describe the same machine (memory size, disk) as the one snapshotted.
    /// The seam's clock must start at `snapshot.state.clock_ns`. The vCPU
    /// gets exactly the snapshot's CPUID, or the restore is refused.
    pub fn restore(config: VmConfig, snapshot: VmSnapshot) -> Result<Self, VmError> {
        let state = snapshot.state;
        let mut vm = Self::build(open_kvm()?, config, &state.vcpu.cpuid, state.net.is_some())?;
        snapshot.memory.restore(&vm.memory)?;
        vm.vcpu.restore(&vm.kvm, &state.vcpu)?;
        if let Some(saved) = &state.cpus {
            let mut cpus = cpus::Cpus::restore(&vm.kvm, &vm._vm, saved)?;
            // Back to the vCPU that was running, with its saved quantum.
            let current = saved.scheduler.current;
            if current != 0 {
                let boot = std::mem::replace(&mut vm.vcpu, cpus.take_parked(current)?);
                cpus.park(0, boot);
            }
            cpus.resume_as_saved();
            vm.cpus = Some(cpus);
        }
        vm.pic.lock().unwrap().restore(&state.pic)?;
        vm.pit.lock().unwrap().restore(&state.pit)?;
        vm.cmos.lock().unwrap().restore(&state.cmos)?;
        vm.serial.lock().unwrap().restore(&state.serial)?;
        vm.i8042.lock().unwrap().restore(&state.i8042)?;
        vm.doorbell.lock().unwrap().restore(&state.doorbell)?;
        vm.block.lock().unwrap().restore(&state.block)?;
        vm.console.lock().unwrap().restore(&state.console)?;
        if let (Some(net), Some(saved)) = (&vm.net, &state.net) {
            net.lock().unwrap().restore(saved)?;
        }
        Ok(vm)
    }

    /// The VM's state now, at the exit the last run stopped at.
    pub fn snapshot(&mut self) -> Result<VmSnapshot, VmError> {
        let clock_ns = self.seam.monotonic_ns();
        self.snapshot_at(clock_ns)
    }

    /// Has KVM say, in `kvm_run`, whether the vCPU can take an interrupt
    /// now, as a running VM's last KVM_RUN said (`snapshot_at` asks that of
    /// the VM it saves). A VM restored from a snapshot taken mid-run must do
    /// this to go on as the saved one would: until its first KVM_RUN its
    /// `kvm_run` says it cannot, and a waiting interrupt would be held for
    /// the window or the doorbell where the saved VM injected it.
    pub fn resume_as_saved(&mut self) {
        self.vcpu.finish_pending_exit();
    }

    /// Like `snapshot`, with the virtual time given: a replayer's clock is
    /// its log, where reading it would consume an event.
    pub fn snapshot_at(&mut self, clock_ns: u64) -> Result<VmSnapshot, VmError> {
        Ok(VmSnapshot {
            state: self.state_at(clock_ns)?,
            memory: MemoryImage::capture(&self.memory),
        })
    }

    /// The machine's state as digests (see `state_digest`).
    pub fn state_digest(&mut self) -> Result<StateDigest, VmError> {
        // The clock is no device: it is the log's, compared as events.
        let state = self.state_at(0)?;
        Ok(StateDigest {
            memory: state_digest::memory(&self.memory),
            registers: state_digest::registers(&state.vcpu),
            devices: state.device_digests(),
        })
    }

    /// The vCPU's and the devices' state, with the virtual time given.
    fn state_at(&mut self, clock_ns: u64) -> Result<VmState, VmError> {
        self.vcpu.finish_pending_exit();
        let (vcpu, cpus) = match &mut self.cpus {
            Some(cpus) => {
                let others = cpus.save(&self.kvm, &mut self.vcpu)?;
                let boot = cpus.boot_vcpu_mut(&mut self.vcpu);
                boot.finish_pending_exit();
                (boot.save(&self.kvm)?, Some(others))
            }
            None => (self.vcpu.save(&self.kvm)?, None),
        };
        Ok(VmState {
            clock_ns,
            vcpu,
            cpus,
            pic: self.pic.lock().unwrap().save(),
            pit: self.pit.lock().unwrap().save(),
            cmos: self.cmos.lock().unwrap().save(),
            serial: self.serial.lock().unwrap().save(),
            i8042: self.i8042.lock().unwrap().save(),
            doorbell: self.doorbell.lock().unwrap().save(),
            block: self.block.lock().unwrap().save(),
            console: self.console.lock().unwrap().save(),
            net: self.net.as_ref().map(|net| net.lock().unwrap().save()),
        })
    }

    /// The VM with its memory, vCPU (given `cpuid`) and devices, before boot
    /// or restore.
    /// With `net`, the network card too.
    fn build(kvm: Kvm, config: VmConfig, cpuid: &[CpuidEntry], net: bool) -> Result<Self, VmError> {
        let vm = kvm.create_vm().map_err(VmError::Kvm)?;
        msr::route_reads_to_vmm(&vm).map_err(VmError::MsrFilter)?;
        let memory = memory::create(config.memory_mib)?;
        memory::register(&vm, &memory).map_err(VmError::Kvm)?;
        let vcpu = Vcpu::new(&kvm, &vm, cpuid)?;
        let out_exit_rip = port_exit::host_convention(&kvm)?;
        let step_method = breakpoint_step::host_method(&kvm)?;
        let kicker = Kicker::for_current_thread()?;
        host_core::keep_vcpu_on_one_core();

        let seam = config.seam;
        let clock = || seam.clone() as Arc<dyn crate::clock::Clock>;
        let pic = Arc::new(Mutex::new(Pic::new()));
        let line = |irq: u8| -> SharedIrqLine { Arc::new(PicIrqLine::new(pic.clone(), irq)) };
        let pit = Arc::new(Mutex::new(Pit::new(clock())));
        let i8042 = Arc::new(Mutex::new(I8042::new()));
        let ram_bytes = memory.last_addr().raw_value() + 1;
        let doorbell = Arc::new(Mutex::new(Doorbell::new(ram_bytes)));
        let cmos = Arc::new(Mutex::new(Cmos::new(clock())));
        let console_tail = ConsoleTail::default();
        let serial = Arc::new(Mutex::new(SerialPort::new(
            line(COM1_IRQ),
            console_tail.clone(),
            config.echo_console,
        )));

        let mut pio = Bus::default();
        for (base, len, device) in pic::pio_devices(&pic)
            .into_iter()
            .chain(i8042::pio_devices(&i8042))
        {
            pio.insert(base, len, device)?;
        }
        pio.insert(PIT_PORT, PIT_PORT_LEN, pit.clone())?;
        pio.insert(CMOS_PORT, CMOS_PORT_LEN, cmos.clone())?;
        pio.insert(COM1_BASE, UART_REGISTERS, serial.clone())?;
        pio.insert(DOORBELL_PORT.into(), DOORBELL_PORT_LEN, doorbell.clone())?;
        let smp_ports = Arc::new(Mutex::new(SmpPorts::default()));
        pio.insert(SMP_PORT.into(), SMP_PORT_LEN, smp_ports.clone())?;

        let disk = ObservedDisk {
            disk: config.disk,
            seam: seam.clone(),
        };
        let block = Arc::new(Mutex::new(MmioTransport::new(
            VirtioBlock::new(Box::new(disk), false),
            memory.clone(),
            line(BLOCK_IRQ),
        )?));
        let console = Arc::new(Mutex::new(MmioTransport::new(
            VirtioConsole::new(),
            memory.clone(),
            line(CONSOLE_IRQ),
        )?));
        let mut mmio = Bus::default();
        mmio.insert(BLOCK_MMIO, MMIO_DEVICE_SIZE, block.clone())?;
        mmio.insert(CONSOLE_MMIO, MMIO_DEVICE_SIZE, console.clone())?;
        let paravirt_clock = Arc::new(Mutex::new(ParavirtClock::new(clock())));
        mmio.insert(CLOCK_MMIO, MMIO_DEVICE_SIZE, paravirt_clock)?;
        let net = match net {
            true => {
                let net = Arc::new(Mutex::new(MmioTransport::new(
                    VirtioNet::new(seam.clone()),
                    memory.clone(),
                    line(NET_IRQ),
                )?));
                mmio.insert(NET_MMIO, MMIO_DEVICE_SIZE, net.clone())?;
                Some(net)
            }
            false => None,
        };

        let timer_line = line(PIT_IRQ);
        Ok(Vm {
            kvm,
            _vm: vm,
            memory,
            vcpu,
            kicker,
            pio,
            mmio,
            pic,
            timer_line,
            pit,
            i8042,
            doorbell,
            cmos,
            serial,
            block,
            console,
            net,
            console_tail,
            seam,
            out_exit_rip,
            exitless_limit: config.exitless_limit,
            at_exit: true,
            last_exit: Instant::now(),
            exitless_warned: false,
            spin_watch: SpinWatch::new(Instant::now()),
            cpus: None,
            smp_ports,
            guest_debug: GuestDebug::default(),
            exit_clock: None,
            step_over_due: false,
            stepping_over: false,
            step_method,
            step_breakpoints: None,
            window: WindowBreakpoint::default(),
            _not_send: PhantomData,
        })
    }

    /// Draws the vCPU schedule from `seed` from now on (`record --chaos`);
    /// nothing to draw with one vCPU.
    pub fn chaos(&mut self, seed: u64) {
        if let Some(cpus) = &mut self.cpus {
            cpus.scheduler.chaos(seed);
        }
    }

    /// Times every exit from now on and tells `observer`; with `delay`,
    /// waits that much longer after each exit of its device.
    pub fn time_exits(&mut self, observer: Box<dyn ExitObserver>, delay: Option<ExitDelay>) {
        self.exit_clock = Some(ExitClock::new(observer, delay));
    }

    /// The last lines the guest wrote to its serial console.
    pub fn console_tail(&self, lines: usize) -> String {
        self.console_tail.last_lines(lines)
    }

    /// Queues bytes for the guest agent; they are delivered as the guest
    /// posts receive buffers.
    pub fn send_to_agent(&mut self, bytes: &[u8]) {
        self.seam.agent_input(bytes);
        self.console.lock().unwrap().send_to_guest(bytes);
    }

    /// Runs the guest until it sends agent output, halts or resets, or until
    /// `deadline` passes.
    pub fn run(&mut self, deadline: Instant) -> Result<VmEvent, VmError> {
        loop {
            if Instant::now() >= deadline {
                return Err(VmError::Timeout { rip: self.rip() });
            }
            if let Some(reason) = self.seam.stop_reason() {
                return Err(VmError::Stopped(reason));
            }
            // At the same log position in a recording and its replay: right
            // after an exit, never on a host timer.
            if self.at_exit && self.seam.memory_check_due() {
                self.seam.memory_checked(state_digest::memory(&self.memory));
            }
            // Only right after an exit: a restored snapshot goes on as from
            // one (it may inject interrupts first).
            if self.at_exit && self.seam.pause_here() {
                // Complete the exiting instruction, as a snapshot here does,
                // so that a paused guest stands past it on every host: SVM
                // and VMX leave RIP at an OUT (and every KVM at an IN) until
                // the next KVM_RUN, and a debugger stepping from the pause
                // would otherwise count that instruction twice.
                self.vcpu.finish_pending_exit();
                return Ok(VmEvent::Paused);
            }
            // Frames arrive at exits only, where a replay finds them again.
            if self.at_exit {
                if let Some(net) = &self.net {
                    net.lock().unwrap().receive_frames();
                }
            }
            if self.at_exit || self.seam.delivery().preemptive() {
                self.deliver_interrupts()?;
            }
            let halted = match self.run_once()? {
                Entry::Kicked => {
                    self.check_exitless()?;
                    continue;
                }
                Entry::Debug(stop) => return Ok(VmEvent::DebugStop(stop)),
                Entry::Exited { halted } => halted,
            };
            let halted = self.schedule(halted)?;
            if self.i8042.lock().unwrap().take_reset_request() {
                return Ok(VmEvent::Reset);
            }
            let output = self.console.lock().unwrap().take_from_guest();
            if !output.is_empty() {
                self.seam.agent_output(&output);
                return Ok(VmEvent::AgentOutput(output));
            }
            if halted {
                let start = Instant::now();
                let wakes = self.wait_while_halted(deadline)?;
                if let Some(clock) = &mut self.exit_clock {
                    clock.halted(start.elapsed());
                }
                if wakes {
                    if let Some(cpus) = &mut self.cpus {
                        cpus.scheduler.woke(cpus.scheduler.current());
                    }
                } else {
                    if self.seam.final_check_due() {
                        let digest = self.state_digest()?;
                        self.seam.final_state(&digest);
                    }
                    return Ok(VmEvent::Halted);
                }
            }
        }
    }

    /// After an exit: acts on the SMP kernel's requests, and with more
    /// than one vCPU has the scheduler pick the one that runs next, which
    /// the seam confirms (a recording logs it, a replay takes the logged
    /// one). Returns whether the running vCPU is halted, waiting for an
    /// interrupt (`halted`: it has just executed HLT).
    fn schedule(&mut self, halted: bool) -> Result<bool, VmError> {
        let request = self.smp_ports.lock().unwrap().take_request();
        if self.cpus.is_none() {
            return Ok(halted);
        }
        let reason = match request {
            Some(SmpRequest::StartAp { block }) => {
                self.start_ap(block)?;
                Reason::Exit
            }
            Some(SmpRequest::Relax) => Reason::Spin,
            None if halted => Reason::Halt {
                for_good: !self.vcpu.interrupts_enabled(),
            },
            None => Reason::Exit,
        };
        let pic_waits = self.pic.lock().unwrap().has_pending_interrupt();
        let Some(cpus) = &mut self.cpus else {
            return Ok(halted);
        };
        let current = cpus.scheduler.current();
        let proposed = match cpus.next_after(reason, pic_waits) {
            Next::Stay => None,
            Next::Switch(cpu) => Some(cpu),
            // The PIC's timer, wired to vCPU 0, is what wakes the guest.
            Next::AllHalted => (current != 0).then_some(0),
        };
        let Some(cpu) = self.seam.schedule(proposed) else {
            return Ok(cpus.scheduler.halted(current));
        };
        cpus.switch(&mut self.vcpu, cpu);
        let halted = cpus.scheduler.halted(cpu);
        // KVM keeps guest debugging per vCPU: the debugger's breakpoints
        // (and a replay's window) go to the vCPU that runs now.
        if !self.stepping_over {
            self.apply_guest_debug(&self.guest_debug)?;
        }
        Ok(halted)
    }

    /// Starts the AP the guest kernel asked for, as its start block at
    /// `block` says (kernels/smp).
    fn start_ap(&mut self, block: u64) -> Result<(), VmError> {
        let mut bytes = [0u8; StartBlock::LEN];
        self.memory
            .read_slice(&mut bytes, GuestAddress(block))
            .map_err(|error| VmError::UnexpectedExit(format!("AP start block: {error}")))?;
        let start = StartBlock::parse(&bytes);
        let cpus = self
            .cpus
            .as_mut()
            .ok_or(VmError::NoSuchCpu(start.apic_id))?;
        let id = start.apic_id as usize;
        let vcpu = cpus
            .parked(id)
            .filter(|_| !cpus.scheduler.started(id))
            .ok_or(VmError::NoSuchCpu(start.apic_id))?;
        vcpu.enter_long_mode(start.entry.into(), start.cr3.into())?;
        cpus.scheduler.start(id);
        tracing::debug!("vCPU {id} started at {:#x}", start.entry);
        Ok(())
    }

    /// Raises the timer line for due ticks, then injects the highest request
    /// for the running vCPU (the PIC's, wired to vCPU 0, then its APIC's) if
    /// it can take it, or has the guest exit when it can (KVM's interrupt
    /// window or the guest's doorbell, as the seam says).
    fn deliver_interrupts(&mut self) -> Result<(), VmError> {
        let now = self.seam.monotonic_ns();
        if self.pit.lock().unwrap().poll(now) {
            self.timer_line.pulse();
        }
        let current = self.running_vcpu();
        let mut waiting = false;
        let mut injected = false;
        if current == 0 {
            let mut pic = self.pic.lock().unwrap();
            waiting = pic.has_pending_interrupt();
            if waiting && self.vcpu.ready_for_interrupt() {
                if let Some(vector) = pic.acknowledge() {
                    self.seam.injected(vector);
                    self.vcpu.inject(vector)?;
                    injected = true;
                }
                waiting = false;
            }
        }
        if let Some(cpus) = &mut self.cpus {
            let apic = &mut cpus.apics[current];
            // KVM holds an NMI while the guest blocks NMIs (in its NMI
            // handler) and delivers it at the IRET that unblocks them: a
            // place in the guest's own instruction stream, which a replay
            // reaches too. The IPI that raised it was the guest's ICR
            // write, which the replay repeats, so the log needs no event.
            if apic.take_nmi() {
                self.vcpu.inject_nmi()?;
                injected = true;
            }
            if apic.has_pending_interrupt() {
                if !injected && self.vcpu.ready_for_interrupt() {
                    if let Some(vector) = apic.acknowledge() {
                        self.seam.injected(vector);
                        self.vcpu.inject(vector)?;
                        injected = true;
                    }
                } else {
                    waiting = true;
                }
            }
            if injected {
                cpus.scheduler.woke(current);
            }
        }
        match self.seam.delivery() {
            Delivery::Anywhere | Delivery::WindowExit => {
                self.vcpu.request_interrupt_window(waiting);
            }
            Delivery::LoggedWindow => {
                let logged = self.seam.logged_window();
                // KVM's window too: where it lands on the logged place it
                // is the exit, where it comes early the guest goes on to
                // the breakpoint (see `logged_window`).
                self.vcpu.request_interrupt_window(logged.is_some());
                if self.window.aim(logged) && !self.stepping_over {
                    tracing::debug!("logged window: running to {logged:x?}");
                    self.apply_guest_debug(&self.guest_debug)?;
                }
            }
            Delivery::Doorbell => self.mark_doorbell(waiting),
        }
        Ok(())
    }

    /// Sets or clears the guest kernel's doorbell byte, if it has one
    /// (see `devices::paravirt`).
    fn mark_doorbell(&self, waiting: bool) {
        let Some(flag) = self.doorbell.lock().unwrap().flag() else {
            return;
        };
        let address = GuestAddress(flag);
        let marked = self
            .memory
            .read_obj::<u8>(address)
            .is_ok_and(|byte| byte != 0);
        if marked != waiting {
            // In RAM by construction (the doorbell refuses other addresses).
            let _ = self.memory.write_obj(u8::from(waiting), address);
        }
    }

    /// Enters the guest once and handles the exit.
    fn run_once(&mut self) -> Result<Entry, VmError> {
        let kick_after = if self.seam.delivery().preemptive() {
            self.until_next_tick().unwrap_or(Duration::MAX)
        } else {
            // Only to check the deadline and the seam: ticks wait for an exit.
            Duration::MAX
        };
        if std::mem::take(&mut self.step_over_due) {
            // Without the window's breakpoint: the step may start on it.
            self.apply_without_window(&guest_debug::step_over())?;
            self.stepping_over = true;
        }
        self.arm_breakpoint_step()?;
        if let Some(clock) = &mut self.exit_clock {
            clock.entering(&self.memory, self.seam.logging_ns());
        }
        self.kicker.arm(kick_after)?;
        // The exit is this vCPU's, whoever runs after it.
        let vcpu = self.running_vcpu();
        let result = self.vcpu.fd.run();
        self.kicker.disarm()?;
        if let Some(clock) = &mut self.exit_clock {
            match &result {
                Ok(VcpuExit::Intr | VcpuExit::Debug(_)) | Err(_) => clock.resumed_without_exit(),
                Ok(exit) => clock.exited(exit_device(exit), vcpu, self.seam.logging_ns()),
            }
        }
        let exit = match result {
            Ok(VcpuExit::Intr) => None,
            // Not an exit: the guest is where it would have been. But the
            // logged interrupt window a replay runs to stands for that exit.
            Ok(VcpuExit::Debug(debug)) => match self.window_stop(&debug)? {
                WindowStop::Reached => {
                    // A debugger's step that lands here is not shown as a
                    // stop of its own: the exit comes first.
                    self.stepping_over = false;
                    self.window.aim(None);
                    self.apply_guest_debug(&self.guest_debug)?;
                    Some(VcpuExit::IrqWindowOpen)
                }
                WindowStop::Passing => {
                    self.at_exit = false;
                    self.step_over_due = true;
                    return Ok(Entry::Kicked);
                }
                WindowStop::Other => return self.debug_stop(&debug),
            },
            Ok(exit) => Some(exit),
            Err(error) if error.errno() == libc::EINTR => None,
            Err(error) => return Err(VmError::Run(error)),
        };
        self.at_exit = exit.is_some();
        let Some(exit) = exit else {
            return Ok(Entry::Kicked);
        };
        self.last_exit = Instant::now();
        self.exitless_warned = false;
        self.spin_watch.exited(self.last_exit);
        match exit {
            VcpuExit::IoIn(..) => self.port_read()?,
            VcpuExit::IoOut(..) => self.port_write()?,
            VcpuExit::MmioRead(..) => self.mmio_read()?,
            VcpuExit::MmioWrite(..) => self.mmio_write()?,
            VcpuExit::Hlt => {
                self.report(Exit::Halt)?;
                return Ok(Entry::Exited { halted: true });
            }
            VcpuExit::IrqWindowOpen => {
                if self.window.opens_early(self.vcpu.place()?) {
                    // Not the logged window: the guest goes on to it.
                    tracing::debug!("logged window: KVM's window opened before it");
                    self.vcpu.request_interrupt_window(false);
                    self.at_exit = false;
                    return Ok(Entry::Kicked);
                }
                self.report(Exit::InterruptWindow)?
            }
            VcpuExit::X86Rdmsr(..) => self.msr_read()?,
            VcpuExit::Shutdown => return Err(VmError::TripleFault { rip: self.rip() }),
            VcpuExit::InternalError => return Err(self.internal_error()),
            VcpuExit::FailEntry(reason, _) => return Err(VmError::FailEntry(reason)),
            other => return Err(VmError::UnexpectedExit(format!("{other:?}"))),
        }
        Ok(Entry::Exited { halted: false })
    }

    /// What a debug stop was for the logged window a replay runs to.
    fn window_stop(&self, debug: &kvm_debug_exit_arch) -> Result<WindowStop, VmError> {
        if !self.window.aimed() {
            return Ok(WindowStop::Other);
        }
        let now = self.vcpu.place()?;
        let stop = self.window.stop(debug.dr6, now);
        if stop != WindowStop::Other {
            tracing::debug!(
                "logged window: {stop:?} at RIP {:#x}, registers {:016x}",
                now.rip,
                now.registers
            );
        }
        Ok(stop)
    }

    /// A debug stop for the debugger, or on its way (a step over a
    /// breakpoint, a step made with breakpoints).
    fn debug_stop(&mut self, debug: &kvm_debug_exit_arch) -> Result<Entry, VmError> {
        self.at_exit = false;
        let stop = match (DebugStop::from_kvm(debug), self.step_breakpoints) {
            // One of the breakpoints that make a step, not the debugger's.
            (DebugStop::Breakpoint { index, rip }, Some(theirs)) if index >= theirs => {
                DebugStop::Step { rip }
            }
            (stop, _) => stop,
        };
        if std::mem::take(&mut self.stepping_over) {
            // Stepped past the breakpoint: put the breakpoints back.
            self.apply_guest_debug(&self.guest_debug)?;
            if !self.guest_debug.single_step {
                return Ok(Entry::Kicked);
            }
        }
        self.step_over_due = stop.needs_step_over(&self.guest_debug);
        Ok(Entry::Debug(stop))
    }

    /// Stops the guest at `debug`'s breakpoints, or after every
    /// instruction; an empty `debug` turns stopping off.
    pub fn set_guest_debug(&mut self, debug: &GuestDebug) -> Result<(), VmError> {
        self.guest_debug = debug.clone();
        if !self.stepping_over {
            self.apply_guest_debug(debug)?;
        }
        Ok(())
    }

    /// Before entering a guest that single-steps: on a host whose guest
    /// would see the trap flag, puts breakpoints where the instruction at
    /// RIP continues (see `breakpoint_step::arm`), after the debugger's own;
    /// on a host that steps with the flag, takes it off for a return to
    /// user mode (see `breakpoint_step::arm_past_user_mode`).
    fn arm_breakpoint_step(&mut self) -> Result<(), VmError> {
        let was_armed = self.step_breakpoints.take().is_some();
        // Before every entry: nothing to do (and nothing to copy) unless
        // the guest is stepping.
        let stepping = self.stepping_over || self.guest_debug.single_step;
        if !stepping {
            return Ok(());
        }
        let in_force = if self.stepping_over {
            guest_debug::step_over()
        } else {
            self.guest_debug.clone()
        };
        let regs = self.vcpu.fd.get_regs().map_err(VmError::Kvm)?;
        let sregs = self.vcpu.fd.get_sregs().map_err(VmError::Kvm)?;
        let syscall_entry = self.vcpu.msr(MSR_LSTAR)?;
        let arm = match self.step_method {
            StepMethod::Breakpoints => breakpoint_step::arm,
            StepMethod::TrapFlag => breakpoint_step::arm_past_user_mode,
        };
        let armed = arm(&in_force, &regs, &sregs, syscall_entry, &self.memory);
        // A step is one instruction: a logged window it lands on is seen
        // at its stop, and needs no breakpoint of its own.
        match armed {
            Some(armed) => {
                tracing::trace!(rip = regs.rip, ?armed, "step armed");
                self.apply_without_window(&armed)?;
                self.step_breakpoints = Some(in_force.breakpoints.len());
            }
            // With the trap flag, what was in force stays unless a return
            // to user mode took the flag off at the last entry.
            None if self.step_method == StepMethod::TrapFlag && !was_armed => {}
            None => self.apply_without_window(&in_force)?,
        }
        Ok(())
    }

    /// Hands `debug` to KVM, with the breakpoint of the logged window the
    /// guest runs to, if any.
    fn apply_guest_debug(&self, debug: &GuestDebug) -> Result<(), VmError> {
        self.apply_to_kvm(&self.window.added_to(debug)?)
    }

    fn apply_without_window(&self, debug: &GuestDebug) -> Result<(), VmError> {
        self.window.left_out();
        self.apply_to_kvm(debug)
    }

    fn apply_to_kvm(&self, debug: &GuestDebug) -> Result<(), VmError> {
        self.vcpu
            .fd
            .set_guest_debug(&debug.to_kvm()?)
            .map_err(|error| VmError::GuestDebug(GuestDebugError::Set(error)))
    }

    /// How many vCPUs the machine has.
    pub fn vcpu_count(&self) -> usize {
        self.cpus.as_ref().map_or(1, |cpus| cpus.apics.len())
    }

    /// The index of the vCPU that runs (0 until a switch; always 0 with
    /// one vCPU).
    pub fn running_vcpu(&self) -> usize {
        self.cpus
            .as_ref()
            .map_or(0, |cpus| cpus.scheduler.current())
    }

    /// The guest as it stands, for an observer: as the running vCPU sees it.
    pub fn view(&self) -> Result<GuestView<'_>, VmError> {
        self.view_of(self.running_vcpu())
    }

    /// The guest as vCPU `vcpu` sees it, running or parked: its registers
    /// and page tables.
    pub fn view_of(&self, vcpu: usize) -> Result<GuestView<'_>, VmError> {
        let fd = match &self.cpus {
            Some(cpus) if vcpu != cpus.scheduler.current() => {
                &cpus.parked(vcpu).ok_or(VmError::NoVcpu(vcpu))?.fd
            }
            None if vcpu != 0 => return Err(VmError::NoVcpu(vcpu)),
            _ => &self.vcpu.fd,
        };
        Ok(GuestView {
            vcpu,
            regs: fd.get_regs().map_err(VmError::Kvm)?,
            sregs: fd.get_sregs().map_err(VmError::Kvm)?,
            memory: &self.memory,
        })
    }

    /// Reports an exit that carries no data, with where the guest was.
    fn report(&self, exit: Exit<'_>) -> Result<(), VmError> {
        self.seam.exit(exit, self.vcpu.place()?);
        Ok(())
    }

    /// A port read: each access of a string instruction reads its own
    /// element from the device, in order.
    fn port_read(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let PioExit { port, size, data } = self.vcpu.pio_exit();
        let len = u16::try_from(data.len())
            .map_err(|_| VmError::UnexpectedExit(format!("port read of {} bytes", data.len())))?;
        self.seam.exit(Exit::PioRead { port, len }, at);
        if !self.pio.read_elements(port.into(), size, data) {
            // Nothing there: an ISA bus floats high.
            data.fill(0xff);
        }
        self.seam.read_result(data);
        Ok(())
    }

    /// A port write: each access of a string instruction writes its own
    /// element to the device, in order.
    fn port_write(&mut self) -> Result<(), VmError> {
        let at = match self.out_exit_rip {
            OutExitRip::PastInstruction => self.vcpu.place()?,
            OutExitRip::AtInstruction => self.vcpu.place_past_out(&self.memory)?,
        };
        let PioExit { port, size, data } = self.vcpu.pio_exit();
        self.seam.exit(Exit::PioWrite { port, data }, at);
        self.pio.write_elements(port.into(), size, data);
        Ok(())
    }

    /// An RDMSR of an MSR the VMM answers (see `msr`): from its model.
    fn msr_read(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let read = self.vcpu.msr_read_exit();
        self.seam.exit(Exit::MsrRead { index: read.index }, at);
        let value = msr::read(read.index, || self.seam.monotonic_ns());
        *read.data = value;
        self.seam.read_result(&value.to_le_bytes());
        Ok(())
    }

    fn mmio_read(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let MmioExit { address, data } = self.vcpu.mmio_exit();
        let len = data.len() as u8;
        self.seam.exit(Exit::MmioRead { address, len }, at);
        let apic = self
            .cpus
            .as_ref()
            .is_some_and(|cpus| cpus.mmio_read(address, data));
        if !apic && !self.mmio.read(address, data) {
            data.fill(0xff);
        }
        self.seam.read_result(data);
        Ok(())
    }

    fn mmio_write(&mut self) -> Result<(), VmError> {
        let at = self.vcpu.place()?;
        let MmioExit { address, data } = self.vcpu.mmio_exit();
        self.seam.exit(Exit::MmioWrite { address, data }, at);
        let apic = self
            .cpus
            .as_mut()
            .is_some_and(|cpus| cpus.mmio_write(address, data));
        if !apic {
            self.mmio.write(address, data);
        }
        Ok(())
    }

    /// Stops a non-preemptive run whose guest kernel spins while a tick is
    /// due: nothing else would ever interrupt it. A kernel that goes long
    /// without an exit but works is left to work (see `spin_watch`).
    ///
    /// Guest user code computing without system calls makes no exits
    /// either, and that is a normal workload: it only gets a warning, once
    /// per stretch, saying why the rest of the guest waits. Looking at the
    /// guest (its registers) is no input: nothing is injected here.
    fn check_exitless(&mut self) -> Result<(), VmError> {
        let Some(limit) = self.exitless_limit else {
            return Ok(());
        };
        if self.seam.delivery().preemptive() {
            return Ok(());
        }
        let now = Instant::now();
        let regs = self.vcpu.fd.get_regs().map_err(VmError::Kvm)?;
        self.spin_watch.sampled(vcpu::register_digest(&regs), now);
        let exitless = now.saturating_duration_since(self.last_exit);
        // Reading the clock here would be an input at a point no replay can
        // find again; a tick is scheduled, and after `limit` it is due.
        let tick_scheduled = self.pit.lock().unwrap().next_deadline_ns().is_some();
        if exitless < limit || !tick_scheduled {
            return Ok(());
        }
        if !self.vcpu.in_user_mode()? {
            let repeating = self.spin_watch.repeating_for(now);
            if repeating < limit {
                return Ok(());
            }
            return Err(VmError::Exitless {
                seconds: exitless.as_secs(),
                repeating: repeating.as_secs(),
                states: self.spin_watch.states(),
                rip: regs.rip,
                vcpu: self.cpus.as_ref().map(|cpus| cpus.scheduler.current()),
            });
        }
        if !self.exitless_warned {
            tracing::warn!(
                "guest user code has computed for {} s without a VM exit (RIP {:#x}); while recording, \
                 other guest processes and timers wait until it makes a system call. \
                 If it is waiting for one of them, it will wait for ever: stop it with Ctrl-C, \
                 or use `provm run`, which preempts it",
                exitless.as_secs(),
                regs.rip
            );
            self.exitless_warned = true;
        }
        Ok(())
    }

    /// The guest executed HLT. With interrupts enabled it waits for the next
    /// timer tick; returns false when it can never wake (halted for good).
    fn wait_while_halted(&mut self, deadline: Instant) -> Result<bool, VmError> {
        if !self.vcpu.interrupts_enabled() {
            return Ok(false);
        }
        let apic_waits = self
            .cpus
            .as_ref()
            .is_some_and(|cpus| cpus.apics[cpus.scheduler.current()].has_pending_interrupt());
        if apic_waits || self.pic.lock().unwrap().has_pending_interrupt() {
            return Ok(true);
        }
        let tick = self
            .pit
            .lock()
            .unwrap()
            .next_deadline_ns()
            .ok_or(VmError::Stuck)?;
        let can_receive = self
            .net
            .as_ref()
            .is_some_and(|net| net.lock().unwrap().can_receive());
        if can_receive {
            self.seam.wait_for_frame_until(tick, deadline);
        } else {
            self.seam.wait_until(tick, deadline);
        }
        Ok(true)
    }

    /// How long until the PIT's next interrupt, if it has one scheduled.
    fn until_next_tick(&self) -> Option<Duration> {
        let tick = self.pit.lock().unwrap().next_deadline_ns()?;
        Some(Duration::from_nanos(
            tick.saturating_sub(self.seam.monotonic_ns()),
        ))
    }

    /// The guest's instruction pointer (0 if KVM cannot say).
    pub fn rip(&self) -> u64 {
        self.vcpu.fd.get_regs().map_or(0, |regs| regs.rip)
    }

    fn internal_error(&mut self) -> VmError {
        // SAFETY: the exit reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the live member.
        let suberror = unsafe {
            self.vcpu
                .fd
                .get_kvm_run()
                .__bindgen_anon_1
                .internal
                .suberror
        };
        let rip = self.rip();
        VmError::Internal {
            suberror,
            rip,
            code: self.code_bytes(rip),
        }
    }

    /// The instruction bytes at a guest virtual address, for error reports.
    fn code_bytes(&self, rip: u64) -> String {
        let Ok(translation) = self.vcpu.fd.translate_gva(rip) else {
            return "unavailable (address not translatable)".into();
        };
        let mut bytes = [0u8; 16];
        if translation.valid == 0
            || self
                .memory
                .read_slice(&mut bytes, GuestAddress(translation.physical_address))
                .is_err()
        {
            return "unavailable (address not mapped)".into();
        }
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Opens /dev/kvm, naming the fix when it is missing or not ours to use.
pub(crate) fn open_kvm() -> Result<Kvm, VmError> {
    Kvm::new().map_err(|error| match error.errno() {
        libc::ENOENT => VmError::NoKvm,
        libc::EACCES | libc::EPERM => VmError::KvmPermission,
        _ => VmError::Kvm(error),
    })
}

/// Fails early, before any other work, when KVM cannot be used.
pub fn check_kvm() -> Result<(), VmError> {
    open_kvm().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::code_guest::CodeGuest;
    use crate::seam::Place;

    #[test]
    fn exits_are_named_by_the_device_at_their_address() {
        assert_eq!(port_device(0x3fd), "serial");
        assert_eq!(port_device(0x21), "pic");
        assert_eq!(port_device(0x43), "pit");
        assert_eq!(port_device(0x441), "doorbell");
        assert_eq!(port_device(0x80), "none");
        assert_eq!(mmio_device(CLOCK_MMIO + 8), "clock");
        assert_eq!(mmio_device(BLOCK_MMIO), "virtio-blk");
        assert_eq!(mmio_device(MMIO_START - 1), "none");
        // Every name exits are timed and delayed by is listed.
        let ports = (0..=u16::MAX).map(port_device);
        let mmio = (0..4).map(|device| mmio_device(MMIO_START + device * MMIO_DEVICE_SIZE));
        for name in ports.chain(mmio) {
            assert!(EXIT_DEVICES.contains(&name), "{name}");
        }
    }

    const BUFFER: u64 = 0x2000;

    /// 32-bit code: `rep insw` of two words from port 0x3f8 into BUFFER, HLT.
    const REP_INSW: &[u8] = &[
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0xb9, 0x02, 0x00, 0x00, 0x00, // mov ecx, 2
        0xbf, 0x00, 0x20, 0x00, 0x00, // mov edi, BUFFER
        0xfc, // cld
        0x66, 0xf3, 0x6d, // rep insw
        0xf4, // hlt
    ];

    /// A vCPU about to run REP_INSW, with the VM and memory it needs.
    fn rep_insw_guest() -> CodeGuest {
        tiny_guest(REP_INSW, false)
    }

    /// A vCPU about to run `code` (32-bit, at CODE), with the VM and memory
    /// it needs; `msrs_to_vmm` routes the MSR reads provm answers to it.
    fn tiny_guest(code: &[u8], msrs_to_vmm: bool) -> CodeGuest {
        CodeGuest::new(&open_kvm().unwrap(), code, msrs_to_vmm).unwrap()
    }

    /// KVM's report of a string instruction, as `Vcpu::pio_exit` reads it:
    /// the access size and all the accesses' data at one exit.
    #[test]
    fn string_port_input_arrives_as_accesses_of_its_size() {
        let CodeGuest {
            memory, mut vcpu, ..
        } = rep_insw_guest();
        assert!(matches!(vcpu.fd.run(), Ok(VcpuExit::IoIn(0x3f8, _))));
        let PioExit { port, size, data } = vcpu.pio_exit();
        assert_eq!((port, size, data.len()), (0x3f8, 2, 4));
        data.copy_from_slice(b"rep!");
        assert!(matches!(vcpu.fd.run(), Ok(VcpuExit::Hlt)));
        let mut received = [0u8; 4];
        memory
            .read_slice(&mut received, GuestAddress(BUFFER))
            .unwrap();
        assert_eq!(&received, b"rep!");
    }

    /// The place read at an exit (from the registers KVM syncs into kvm_run,
    /// where it can) is the one KVM_GET_REGS gives, at every exit.
    #[test]
    fn the_place_of_an_exit_is_the_vcpus_registers_there() {
        let guest = rep_insw_guest();
        let mut vcpu = guest.vcpu;
        let in_guest = |vcpu: &Vcpu| {
            let regs = vcpu.fd.get_regs().unwrap();
            Place {
                rip: regs.rip,
                registers: crate::vcpu::register_digest(&regs),
            }
        };
        assert!(matches!(vcpu.fd.run(), Ok(VcpuExit::IoIn(..))));
        let at_insw = vcpu.place().unwrap();
        assert_eq!(at_insw, in_guest(&vcpu));
        assert!(matches!(vcpu.fd.run(), Ok(VcpuExit::Hlt)));
        let at_hlt = vcpu.place().unwrap();
        assert_eq!(at_hlt, in_guest(&vcpu));
        assert_ne!(at_hlt.rip, at_insw.rip);
        assert_ne!(at_hlt.registers, at_insw.registers);
    }

    /// 32-bit code: RDMSR of the TSC, HLT.
    const RDMSR_TSC: &[u8] = &[
        0xb9, 0x10, 0x00, 0x00, 0x00, // mov ecx, 0x10
        0x0f, 0x32, // rdmsr
        0xf4, // hlt
    ];

    /// The guest's RDMSR of a host-dependent MSR reaches the VMM, and the
    /// guest gets the VMM's answer, on this host's KVM.
    #[test]
    fn a_filtered_msr_read_exits_and_takes_the_vmms_value() {
        let guest = tiny_guest(RDMSR_TSC, true);
        let mut vcpu = guest.vcpu;
        match vcpu.fd.run() {
            Ok(VcpuExit::X86Rdmsr(read)) => {
                assert_eq!(read.index, msr::IA32_TSC);
                *read.data = 0x1234_5678_9abc_def0;
            }
            other => panic!("expected an RDMSR exit, got {other:?}"),
        }
        assert!(matches!(vcpu.fd.run(), Ok(VcpuExit::Hlt)));
        let regs = vcpu.fd.get_regs().unwrap();
        assert_eq!((regs.rdx, regs.rax), (0x1234_5678, 0x9abc_def0));
    }
}
