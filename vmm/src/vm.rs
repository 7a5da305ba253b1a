//! A booted virtual machine and its run loop.
//!
//! Everything the guest receives passes through `Vm::run_once` and
//! `Vm::deliver_interrupts`, on the vCPU thread: port and MMIO reads, device
//! completions, interrupt injections, clock readings. That is the seam a
//! recorder or replayer attaches to.

use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::boot::{self, BootError};
use crate::bus::{Bus, BusError};
use crate::clock::Clock;
use crate::cpuid;
use crate::devices::cmos::{Cmos, CMOS_PORT, CMOS_PORT_LEN};
use crate::devices::i8042::{self, I8042};
use crate::devices::pic::{self, Pic, PicIrqLine};
use crate::devices::pit::{Pit, PIT_PORT, PIT_PORT_LEN};
use crate::devices::serial::{ConsoleTail, SerialPort, COM1_BASE, COM1_IRQ, UART_REGISTERS};
use crate::devices::virtio::block::VirtioBlock;
use crate::devices::virtio::console::VirtioConsole;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::SharedIrqLine;
use crate::disk::Disk;
use crate::memory::{self, GuestMemory, MemoryError, MMIO_DEVICE_SIZE, MMIO_START};
use crate::vcpu::{Kicker, Vcpu, VcpuError};

/// The virtio devices: where each sits and which PIC line it raises.
const BLOCK_MMIO: u64 = MMIO_START;
const BLOCK_IRQ: u8 = 5;
const CONSOLE_MMIO: u64 = MMIO_START + MMIO_DEVICE_SIZE;
const CONSOLE_IRQ: u8 = 6;
const PIT_IRQ: u8 = 0;

/// Everything needed to build a VM.
pub struct VmConfig {
    pub memory_mib: u64,
    pub kernel: PathBuf,
    /// An uncompressed cpio archive, the guest's initial root.
    pub initramfs: Vec<u8>,
    /// Kernel arguments; the VM appends the descriptions of its devices.
    pub cmdline: String,
    /// The guest's one disk, /dev/vda.
    pub disk: Box<dyn Disk>,
    /// Echo the guest console to the host's stderr as it is written.
    pub echo_console: bool,
    pub clock: Arc<dyn Clock>,
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
    #[error("device layout: {0}")]
    Bus(#[from] BusError),
    #[error("virtio device: {0}")]
    Virtio(#[from] crate::devices::virtio::mmio::Error),
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
    #[error("the guest did not finish within the time limit")]
    Timeout,
    #[error("KVM_RUN failed: {0}")]
    Run(kvm_ioctls::Error),
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
}

pub struct Vm {
    _kvm: Kvm,
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
    console: Arc<Mutex<MmioTransport<VirtioConsole>>>,
    console_tail: ConsoleTail,
    clock: Arc<dyn Clock>,
    /// The vCPU's signal timer targets the thread that created the VM.
    _not_send: PhantomData<*const ()>,
}

impl Vm {
    /// Creates the VM, loads the kernel and initramfs, and wires the devices.
    /// The VM must be run on the thread that creates it.
    pub fn new(config: VmConfig) -> Result<Self, VmError> {
        let kvm = open_kvm()?;
        let vm = kvm.create_vm().map_err(VmError::Kvm)?;
        let memory = memory::create(config.memory_mib)?;
        register_memory(&vm, &memory)?;

        let mut kernel = File::open(&config.kernel).map_err(|source| VmError::KernelMissing {
            path: config.kernel.clone(),
            source,
        })?;
        let (vcpu, unenforced) = Vcpu::new(&kvm, &vm)?;
        if !unenforced.is_empty() {
            tracing::debug!(
                count = unenforced.len(),
                "KVM left hidden CPU features visible; the kernel is told to ignore them"
            );
        }
        let cmdline = format!(
            "{} {} virtio_mmio.device=4K@{BLOCK_MMIO:#x}:{BLOCK_IRQ} virtio_mmio.device=4K@{CONSOLE_MMIO:#x}:{CONSOLE_IRQ}",
            config.cmdline,
            cpuid::kernel_args_hiding(&unenforced),
        );
        let entry = boot::load_kernel(&memory, &mut kernel, &config.initramfs, &cmdline)?;
        vcpu.enter_pvh(entry)?;
        let kicker = Kicker::for_current_thread()?;

        let pic = Arc::new(Mutex::new(Pic::new()));
        let line = |irq: u8| -> SharedIrqLine { Arc::new(PicIrqLine::new(pic.clone(), irq)) };
        let pit = Arc::new(Mutex::new(Pit::new(config.clock.clone())));
        let i8042 = Arc::new(Mutex::new(I8042::new()));
        let console_tail = ConsoleTail::default();
        let serial = SerialPort::new(line(COM1_IRQ), console_tail.clone(), config.echo_console);

        let mut pio = Bus::default();
        for (base, len, device) in pic::pio_devices(&pic)
            .into_iter()
            .chain(i8042::pio_devices(&i8042))
        {
            pio.insert(base, len, device)?;
        }
        pio.insert(PIT_PORT, PIT_PORT_LEN, pit.clone())?;
        let cmos = Cmos::new(config.clock.clone());
        pio.insert(CMOS_PORT, CMOS_PORT_LEN, Arc::new(Mutex::new(cmos)))?;
        pio.insert(COM1_BASE, UART_REGISTERS, Arc::new(Mutex::new(serial)))?;

        let block = MmioTransport::new(
            VirtioBlock::new(config.disk, false),
            memory.clone(),
            line(BLOCK_IRQ),
        )?;
        let console = Arc::new(Mutex::new(MmioTransport::new(
            VirtioConsole::new(),
            memory.clone(),
            line(CONSOLE_IRQ),
        )?));
        let mut mmio = Bus::default();
        mmio.insert(BLOCK_MMIO, MMIO_DEVICE_SIZE, Arc::new(Mutex::new(block)))?;
        mmio.insert(CONSOLE_MMIO, MMIO_DEVICE_SIZE, console.clone())?;

        let timer_line = line(PIT_IRQ);
        Ok(Vm {
            _kvm: kvm,
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
            console,
            console_tail,
            clock: config.clock,
            _not_send: PhantomData,
        })
    }

    /// The last lines the guest wrote to its serial console.
    pub fn console_tail(&self, lines: usize) -> String {
        self.console_tail.last_lines(lines)
    }

    /// Queues bytes for the guest agent; they are delivered as the guest
    /// posts receive buffers.
    pub fn send_to_agent(&mut self, bytes: &[u8]) {
        self.console.lock().unwrap().send_to_guest(bytes);
    }

    /// Runs the guest until it sends agent output, halts or resets, or until
    /// `deadline` passes.
    pub fn run(&mut self, deadline: Instant) -> Result<VmEvent, VmError> {
        loop {
            if Instant::now() >= deadline {
                return Err(VmError::Timeout);
            }
            self.deliver_interrupts()?;
            let halted = self.run_once()?;
            if self.i8042.lock().unwrap().take_reset_request() {
                return Ok(VmEvent::Reset);
            }
            let output = self.console.lock().unwrap().take_from_guest();
            if !output.is_empty() {
                return Ok(VmEvent::AgentOutput(output));
            }
            if halted && !self.wait_while_halted(deadline)? {
                return Ok(VmEvent::Halted);
            }
        }
    }

    /// Raises the timer line for due ticks, then injects the PIC's highest
    /// request if the guest can take it, or asks KVM for an exit when it can.
    fn deliver_interrupts(&mut self) -> Result<(), VmError> {
        let now = self.clock.monotonic_ns();
        if self.pit.lock().unwrap().poll(now) {
            self.timer_line.pulse();
        }
        let mut pic = self.pic.lock().unwrap();
        if !pic.has_pending_interrupt() {
            self.vcpu.request_interrupt_window(false);
            return Ok(());
        }
        if self.vcpu.ready_for_interrupt() {
            if let Some(vector) = pic.acknowledge() {
                self.vcpu.inject(vector)?;
            }
            self.vcpu.request_interrupt_window(false);
        } else {
            self.vcpu.request_interrupt_window(true);
        }
        Ok(())
    }

    /// Enters the guest once and handles the exit; true if the guest halted.
    fn run_once(&mut self) -> Result<bool, VmError> {
        self.kicker
            .arm(self.until_next_tick().unwrap_or(Duration::MAX));
        let exit = match self.vcpu.fd.run() {
            Ok(exit) => exit,
            // The kick timer interrupted KVM_RUN: a tick may be due.
            Err(error) if error.errno() == libc::EINTR => return Ok(false),
            Err(error) => return Err(VmError::Run(error)),
        };
        match exit {
            VcpuExit::IoIn(port, data) => {
                if !self.pio.read(port.into(), data) {
                    // Nothing there: an ISA bus floats high.
                    data.fill(0xff);
                }
            }
            VcpuExit::IoOut(port, data) => {
                self.pio.write(port.into(), data);
            }
            VcpuExit::MmioRead(address, data) => {
                if !self.mmio.read(address, data) {
                    data.fill(0xff);
                }
            }
            VcpuExit::MmioWrite(address, data) => {
                self.mmio.write(address, data);
            }
            VcpuExit::Hlt => return Ok(true),
            VcpuExit::IrqWindowOpen | VcpuExit::Intr => {}
            VcpuExit::Shutdown => return Err(VmError::TripleFault { rip: self.rip() }),
            VcpuExit::InternalError => return Err(self.internal_error()),
            VcpuExit::FailEntry(reason, _) => return Err(VmError::FailEntry(reason)),
            other => return Err(VmError::UnexpectedExit(format!("{other:?}"))),
        }
        Ok(false)
    }

    /// The guest executed HLT. With interrupts enabled it waits for the next
    /// timer tick; returns false when it can never wake (halted for good).
    fn wait_while_halted(&mut self, deadline: Instant) -> Result<bool, VmError> {
        if !self.vcpu.interrupts_enabled() {
            return Ok(false);
        }
        if self.pic.lock().unwrap().has_pending_interrupt() {
            return Ok(true);
        }
        let wait = self.until_next_tick().ok_or(VmError::Stuck)?;
        std::thread::sleep(wait.min(deadline.saturating_duration_since(Instant::now())));
        Ok(true)
    }

    /// How long until the PIT's next interrupt, if it has one scheduled.
    fn until_next_tick(&self) -> Option<Duration> {
        let tick = self.pit.lock().unwrap().next_deadline_ns()?;
        Some(Duration::from_nanos(
            tick.saturating_sub(self.clock.monotonic_ns()),
        ))
    }

    fn rip(&self) -> u64 {
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
fn open_kvm() -> Result<Kvm, VmError> {
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

fn register_memory(vm: &VmFd, memory: &GuestMemory) -> Result<(), VmError> {
    for (slot, region) in memory.iter().enumerate() {
        let region_spec = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the region is mapped for the VM's whole life (the Vm keeps
        // `memory`), and slots do not overlap.
        unsafe { vm.set_user_memory_region(region_spec) }.map_err(VmError::Kvm)?;
    }
    Ok(())
}
