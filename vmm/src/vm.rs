//! A booted (or restored) virtual machine and its run loop.
//!
//! Everything the guest receives passes through `Vm::run_once` and
//! `Vm::deliver_interrupts`, on the vCPU thread: port and MMIO reads, device
//! completions, interrupt injections, clock readings. Each is reported to
//! the VM's [`Seam`], which a recorder or replayer implements.
//!
//! Here: building the machine (boot or restore) and the run loop. Beside
//! it: `layout` (where the devices sit, and their names), `devices` (the
//! devices as one part, built as `layout` places them), `run_state` (what
//! the run loop keeps between entries), `exits` (the device accesses),
//! `debug` (breakpoints and steps, and their state), `late_arming` (a
//! replay's late search for a timed preemption), `state` (what a
//! snapshot saves), `view` (what an observer reads), `cpus` (the vCPUs
//! beyond the running one), `parallel` (the vCPUs side by side, where
//! nothing is recorded) and `error`.

use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvm_ioctls::{Kvm, VcpuExit, VmFd};
use provm_cpu_model::{self as cpu_model, Baseline, CpuidEntry, GuestCpu, Platform};
use vm_memory::{Bytes, GuestAddress};

use crate::boot::{self, BootError};
use crate::devices::paravirt::{SmpRequest, StartBlock};
use crate::disk::{Disk, InputMedium};
use crate::exit_timing::{ExitClock, ExitDelay, ExitObserver};
use crate::guest_debug::{self, DebugStop, GuestDebug};
use crate::host_core;
use crate::logged_stop::StopKind;
use crate::memory::{self, GuestMemory};
use crate::mp_table;
use crate::msr;
use crate::preemption;
use crate::probes::port_exit::{self, OutExitRip};
use crate::scheduler::{Next, Reason};
use crate::seam::{Delivery, Exit, Instance, LoggedStop, Seam, HOST_INPUT_DUE};
use crate::state_digest;
use crate::vcpu::{self, Kicker, Vcpu};

mod cpus;
mod debug;
mod devices;
mod error;
mod exits;
#[cfg(test)]
mod fuzz;
mod late_arming;
mod layout;
mod parallel;
mod run_state;
mod state;
mod user_trap;
mod vector_state;
mod view;

pub use error::VmError;
use layout::{
    exit_device, BLOCK_IRQ, BLOCK_MMIO, CLOCK_MMIO, CONSOLE_IRQ, CONSOLE_MMIO, INPUT_DISK_IRQ,
    INPUT_DISK_MMIO, KERNEL_SPACE, NET_IRQ, NET_MMIO,
};
pub use layout::{mmio_device, port_device, EXIT_DEVICES};
pub use state::{VmSnapshot, VmState};
pub use view::GuestView;

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
    /// The input disk and its medium, when the job's inputs go by disk: a
    /// read-only virtio-blk device, /dev/vdb. A guest booted with one gets
    /// it empty; a restored one must have one exactly if its snapshot has.
    pub input_disk: Option<InputMedium>,
    /// How many vCPUs a booted guest gets (1 to `mp_table::MAX_CPUS`). A
    /// restored one has its snapshot's.
    pub cpus: u8,
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

/// A VM exit by kind, its data left in `kvm_run` (where the handlers read
/// it): it outlives the borrow of the vCPU that KVM_RUN's answer holds.
#[derive(Debug)]
enum ExitKind {
    PortRead,
    PortWrite,
    MmioRead,
    MmioWrite,
    Halt,
    InterruptWindow,
    MsrRead,
    /// Not KVM's: the recorder's preemption (`preemption`), or a replay's
    /// stop at the logged one.
    Preempted(Instance),
    Shutdown,
    InternalError,
    FailEntry(u64),
    Unexpected(String),
}

impl ExitKind {
    fn of(exit: &VcpuExit<'_>) -> Self {
        match exit {
            VcpuExit::IoIn(..) => ExitKind::PortRead,
            VcpuExit::IoOut(..) => ExitKind::PortWrite,
            VcpuExit::MmioRead(..) => ExitKind::MmioRead,
            VcpuExit::MmioWrite(..) => ExitKind::MmioWrite,
            VcpuExit::Hlt => ExitKind::Halt,
            VcpuExit::IrqWindowOpen => ExitKind::InterruptWindow,
            VcpuExit::X86Rdmsr(..) => ExitKind::MsrRead,
            VcpuExit::Shutdown => ExitKind::Shutdown,
            VcpuExit::InternalError => ExitKind::InternalError,
            VcpuExit::FailEntry(reason, _) => ExitKind::FailEntry(*reason),
            other => ExitKind::Unexpected(format!("{other:?}")),
        }
    }
}

pub struct Vm {
    kvm: Kvm,
    vm_fd: VmFd,
    memory: GuestMemory,
    /// The running vCPU. Boxed: a parallel run's threads hold their
    /// vCPU's address while it moves between here and `cpus`.
    vcpu: Box<Vcpu>,
    kicker: Kicker,
    /// The devices and the buses they sit on.
    devices: devices::Devices,
    seam: Arc<dyn Seam>,
    /// Where this host's KVM leaves RIP at an OUT exit (see `port_exit`).
    out_exit_rip: OutExitRip,
    /// What the run loop keeps from one entry into the guest to the next.
    run_loop: run_state::RunState,
    /// The other vCPUs, with more than one (see `cpus`).
    cpus: Option<cpus::Cpus>,
    /// Whether they run side by side (`run_vcpus_in_parallel`).
    parallel: bool,
    /// What stops the guest, and the steps on the way (`debug`).
    debug: debug::DebugState,
    /// Exit timing, when asked for (`time_exits`).
    exit_clock: Option<ExitClock>,
    /// Whether tasks' vector state is saved into guest RAM in the canonical
    /// form (`vector_state`): in a booted VM, and in one restored from a
    /// snapshot whose VM did (machine version 6 on).
    canonical_vector_areas: bool,
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
        let count = config.cpus;
        let guest_cpu = GuestCpu::new(
            &vcpu::supported_cpuid(&kvm)?,
            Platform::detect(),
            boot.cpu,
            count,
        )?;
        let max = kvm.get_max_vcpus();
        if usize::from(count) > max {
            return Err(VmError::TooManyVcpus { asked: count, max });
        }
        let net = config.net;
        let mut vm = Self::build(kvm, config, &guest_cpu.vcpu_table(0), net)?;
        vm.canonical_vector_areas = true;
        if count > 1 {
            vm.cpus = Some(cpus::Cpus::create(
                &vm.kvm, &vm.vm_fd, &guest_cpu, count, &vm.vcpu,
            )?);
            mp_table::write(&vm.memory, count)
                .map_err(|error| BootError::Memory(error.to_string()))?;
        }
        let ignored = guest_cpu.ignored_by_kernel(&vm.vcpu.cpuid);
        if !ignored.is_empty() {
            tracing::debug!(
                count = ignored.len(),
                "KVM left hidden CPU features visible; the kernel is told to ignore them"
            );
        }
        let mut cmdline = format!(
            "{} {} virtio_mmio.device=4K@{BLOCK_MMIO:#x}:{BLOCK_IRQ} virtio_mmio.device=4K@{CONSOLE_MMIO:#x}:{CONSOLE_IRQ} provm_clock={CLOCK_MMIO:#x}",
            boot.cmdline,
            cpu_model::kernel_args(&ignored),
        );
        if net {
            cmdline.push_str(&format!(" virtio_mmio.device=4K@{NET_MMIO:#x}:{NET_IRQ}"));
        }
        if vm.devices.input_disk.is_some() {
            cmdline.push_str(&format!(
                " virtio_mmio.device=4K@{INPUT_DISK_MMIO:#x}:{INPUT_DISK_IRQ}"
            ));
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
        if config.input_disk.is_some() != state.input_disk.is_some() {
            return Err(VmError::InputDiskMismatch {
                snapshot: state.input_disk.is_some(),
            });
        }
        let mut vm = Self::build(open_kvm()?, config, &state.vcpu.cpuid, state.net.is_some())?;
        snapshot.memory.restore(&vm.memory)?;
        vm.vcpu.restore(&vm.kvm, &state.vcpu)?;
        if let Some(saved) = &state.cpus {
            let mut cpus = cpus::Cpus::restore(&vm.kvm, &vm.vm_fd, saved)?;
            // Back to the vCPU that was running, with its saved quantum.
            let current = saved.scheduler.current;
            if current != 0 {
                let boot = std::mem::replace(&mut vm.vcpu, cpus.take_parked(current)?);
                cpus.park(0, boot);
            }
            cpus.resume_as_saved();
            vm.cpus = Some(cpus);
        }
        vm.devices.restore(&state)?;
        vm.canonical_vector_areas = state.canonical_vector_areas;
        Ok(vm)
    }

    /// The VM with its memory, vCPU (given `cpuid`) and devices, before boot
    /// or restore.
    /// With `net`, the network card too.
    fn build(kvm: Kvm, config: VmConfig, cpuid: &[CpuidEntry], net: bool) -> Result<Self, VmError> {
        let vm = kvm.create_vm().map_err(VmError::Kvm)?;
        msr::route_reads_to_vmm(&vm).map_err(VmError::MsrFilter)?;
        let memory = memory::create(config.memory_mib)?;
        memory::register(&vm, &memory).map_err(VmError::Kvm)?;
        let vcpu = Box::new(Vcpu::new(&kvm, &vm, cpuid)?);
        let out_exit_rip = port_exit::host_convention(&kvm)?;
        let debug = debug::DebugState::for_host(&kvm)?;
        let kicker = Kicker::for_current_thread()?;
        host_core::keep_vcpu_on_one_core();

        let seam = config.seam;
        let devices = devices::Devices::new(
            &memory,
            &seam,
            config.disk,
            config.echo_console,
            net,
            config.input_disk,
        )?;
        Ok(Vm {
            kvm,
            vm_fd: vm,
            memory,
            vcpu,
            kicker,
            devices,
            seam,
            out_exit_rip,
            run_loop: run_state::RunState::new(config.exitless_limit),
            cpus: None,
            parallel: false,
            debug,
            exit_clock: None,
            canonical_vector_areas: false,
            _not_send: PhantomData,
        })
    }

    /// Draws the vCPU schedule (with more than one) and the quanta of
    /// preemption (`record --preempt`) from `seed` from now on (`record
    /// --chaos`).
    pub fn chaos(&mut self, seed: u64) {
        if let Some(cpus) = &mut self.cpus {
            cpus.scheduler.chaos(seed);
        }
        self.run_loop.chaos_quanta = Some(preemption::chaos_quanta::ChaosQuanta::new(seed));
    }

    /// How long the guest may compute without an exit before it is
    /// preempted (`record --preempt`): the seam's quantum, or this
    /// stretch's drawn from it (`record --chaos`).
    fn preemption_quantum(&self) -> Option<Duration> {
        let base = self.seam.preemption_quantum()?;
        Some(
            self.run_loop
                .chaos_quanta
                .as_ref()
                .map_or(base, |quanta| quanta.of(base)),
        )
    }

    /// Runs the vCPUs side by side, each on a host thread of its own, from
    /// now on (`provm run`; see `parallel`); nothing with one vCPU. Only
    /// for a seam that logs nothing (a preemptive one), and not while
    /// exits are timed or a debugger is attached: those stay serial.
    pub fn run_vcpus_in_parallel(&mut self) {
        self.parallel = true;
    }

    /// Times every exit from now on and tells `observer`; with `delay`,
    /// waits that much longer after each exit of its device.
    pub fn time_exits(&mut self, observer: Box<dyn ExitObserver>, delay: Option<ExitDelay>) {
        self.exit_clock = Some(ExitClock::new(observer, delay));
    }

    /// The last lines the guest wrote to its serial console.
    pub fn console_tail(&self, lines: usize) -> String {
        self.devices.console_tail.last_lines(lines)
    }

    /// Queues bytes for the guest agent; they are delivered as the guest
    /// posts receive buffers.
    pub fn send_to_agent(&mut self, bytes: &[u8]) {
        self.seam.agent_input(bytes);
        self.devices.console.lock().unwrap().send_to_guest(bytes);
    }

    /// Runs the guest until it sends agent output, halts or resets, or until
    /// `deadline` passes.
    pub fn run(&mut self, deadline: Instant) -> Result<VmEvent, VmError> {
        let parallel = self.parallel
            && self.cpus.is_some()
            && self.seam.delivery().preemptive()
            && self.exit_clock.is_none()
            && self.debug.guest_debug == GuestDebug::default();
        if parallel {
            return parallel::run(self, deadline);
        }
        if !self.run_loop.logging_written_pages && self.seam.preemption_quantum().is_some() {
            preemption::log_written_pages(&self.vm_fd, &self.memory).map_err(VmError::Kvm)?;
            self.run_loop.logging_written_pages = true;
        }
        loop {
            if Instant::now() >= deadline {
                return Err(VmError::Timeout { rip: self.rip() });
            }
            if let Some(reason) = self.seam.stop_reason() {
                return Err(VmError::Stopped(reason));
            }
            if self.run_loop.at_exit && self.seam.host_input_due() {
                return Err(VmError::Stopped(HOST_INPUT_DUE.into()));
            }
            // At the same log position in a recording and its replay: right
            // after an exit, never on a host timer.
            if self.run_loop.at_exit && self.seam.memory_check_due() {
                self.seam.memory_checked(state_digest::memory(&self.memory));
            }
            // Only right after an exit: a restored snapshot goes on as from
            // one (it may inject interrupts first).
            if self.run_loop.at_exit && self.seam.pause_here() {
                // Complete the exiting instruction, as a snapshot here does,
                // so that a paused guest stands past it on every host: SVM
                // and VMX leave RIP at an OUT (and every KVM at an IN) until
                // the next KVM_RUN, and a debugger stepping from the pause
                // would otherwise count that instruction twice.
                self.vcpu.finish_pending_exit();
                return Ok(VmEvent::Paused);
            }
            // Frames arrive at exits only, where a replay finds them again.
            if self.run_loop.at_exit {
                if let Some(net) = &self.devices.net {
                    net.lock().unwrap().receive_frames();
                }
            }
            if self.run_loop.at_exit || self.seam.delivery().preemptive() {
                self.deliver_interrupts()?;
            }
            let halted = match self.run_once()? {
                Entry::Kicked if self.preempt_if_due()? => false,
                Entry::Kicked => {
                    self.check_exitless()?;
                    continue;
                }
                Entry::Debug(stop) => return Ok(VmEvent::DebugStop(stop)),
                Entry::Exited { halted } => halted,
            };
            let halted = self.schedule(halted)?;
            if self.devices.i8042.lock().unwrap().take_reset_request() {
                return Ok(VmEvent::Reset);
            }
            let output = self.devices.console.lock().unwrap().take_from_guest();
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
        let request = self.devices.smp_ports.lock().unwrap().take_request();
        if self.cpus.is_none() {
            return Ok(halted);
        }
        let reason = match request {
            Some(SmpRequest::StartAp { block }) => {
                self.start_ap(block)?;
                Reason::Exit
            }
            Some(SmpRequest::Relax) => Reason::Spin,
            None if std::mem::take(&mut self.run_loop.preempted) => Reason::Spin,
            None if halted => Reason::Halt {
                for_good: !self.vcpu.interrupts_enabled(),
            },
            None => Reason::Exit,
        };
        let pic_waits = self.devices.pic.lock().unwrap().has_pending_interrupt();
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
        if !self.debug.stepping_over {
            self.apply_guest_debug(&self.debug.guest_debug)?;
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
        self.poll_timer();
        let current = self.running_vcpu();
        let mut waiting = false;
        let mut injected = false;
        if current == 0 {
            let mut pic = self.devices.pic.lock().unwrap();
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
        let logged = self.seam.logged_stop();
        // Where a breakpoint cannot stop user mode, `int3`s find a loop's
        // preemption there; not yet a computation's, which a late search
        // finds (`vm::user_trap`).
        let trapped = match &logged {
            Some(LoggedStop::Preemption(at, instance))
                if !self.run_loop.user_mode_stops && at.rip < KERNEL_SPACE =>
            {
                let unreachable = |why| VmError::UserPreemptionUnreachable { rip: at.rip, why };
                if instance.ran_ns.is_some() {
                    return Err(unreachable("a computation's, which a replay searches for late, and this host's search in user code with `int3`s stops at every pass"));
                }
                let code = instance.user_code.ok_or_else(|| unreachable("in a trace of format 13 or before, which does not say where the instruction is in guest memory for an `int3`"))?;
                Some((at.rip, code))
            }
            _ => None,
        };
        match self.seam.delivery() {
            Delivery::Anywhere | Delivery::WindowExit => {
                self.vcpu.request_interrupt_window(waiting);
            }
            Delivery::LoggedWindow => {
                // KVM's window too: where it lands on the logged place it
                // is the exit, where it comes early the guest goes on to
                // the breakpoint (see `logged_stop`).
                let window = matches!(logged, Some(LoggedStop::Window(_)));
                self.vcpu.request_interrupt_window(window);
            }
            Delivery::Doorbell => self.mark_doorbell(waiting),
        }
        let held = self.begin_late_search(&logged)?;
        let aimed = logged.is_some();
        let aim_changed = self.debug.logged_stop.aim(logged);
        if aim_changed {
            self.disarm_user_trap();
            if let Some((rip, code)) = trapped {
                self.arm_user_trap(rip, code)?;
            }
        }
        let changed = aim_changed | self.debug.logged_stop.hold(held);
        if changed && !self.debug.stepping_over {
            tracing::debug!("logged stop: running to it: {aimed}");
            self.keep_guest_debugregs(aimed)?;
            self.apply_guest_debug(&self.debug.guest_debug)?;
        }
        Ok(())
    }

    /// Raises the timer line if a tick is due.
    fn poll_timer(&self) {
        let now = self.seam.monotonic_ns();
        if self.devices.pit.lock().unwrap().poll(now) {
            self.devices.timer_line.pulse();
        }
    }

    /// Sets or clears the guest kernel's doorbell byte, if it has one
    /// (see `devices::paravirt`).
    fn mark_doorbell(&self, waiting: bool) {
        let Some(flag) = self.devices.doorbell.lock().unwrap().flag() else {
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
        } else if let Some(quantum) = self.preemption_quantum() {
            // When the quantum ends, and a quantum apart after: the kicks
            // that look for a loop to preempt (`preempt_if_due`).
            let past = self.run_loop.last_exit.elapsed();
            if past < quantum {
                quantum - past
            } else {
                quantum
            }
        } else {
            // Only to check the deadline and the seam: ticks wait for an exit.
            Duration::MAX
        };
        // A late search's free run ends on time (its thread's: never
        // later than the wall clock's).
        let kick_after = match self
            .run_loop
            .late
            .as_ref()
            .and_then(|late| late.free_run_left_ns())
        {
            Some(left_ns) => kick_after.min(Duration::from_nanos(left_ns)),
            None => kick_after,
        };
        if std::mem::take(&mut self.debug.step_over_due) {
            // Without the window's breakpoint: the step may start on it.
            self.apply_without_window(&guest_debug::step_over())?;
            self.debug.stepping_over = true;
        }
        self.arm_breakpoint_step()?;
        if let Some(clock) = &mut self.exit_clock {
            clock.entering(&self.memory, self.seam.logging_ns());
        }
        self.save_late_search_start()?;
        // The guest's computing time, where a preemption is timed
        // (recording) or searched for late (replay).
        let stepping_over = self.debug.stepping_over;
        let cpu_before = (self.seam.preemption_quantum().is_some() || self.run_loop.late.is_some())
            .then(preemption::thread_cpu_ns);
        self.kicker.arm(kick_after)?;
        // The exit is this vCPU's, whoever runs after it.
        let vcpu = self.running_vcpu();
        let returning_from_trap = self.returning_from_user_trap();
        // The search's patches are in guest memory only while it runs.
        if let Some(trap) = &mut self.debug.user_trap {
            trap.patches.lay(&self.memory);
        }
        let result = self.vcpu.run();
        if let Some(trap) = &mut self.debug.user_trap {
            trap.patches.lift(&self.memory);
        }
        self.kicker.disarm()?;
        if let Some(before) = cpu_before {
            let cpu_ns = preemption::thread_cpu_ns().saturating_sub(before);
            self.run_loop.computed_ns += cpu_ns;
            if let Some(late) = &mut self.run_loop.late {
                late.entered(cpu_ns, stepping_over);
            }
        }
        // An exit before the preemption a late search runs to: the
        // recording had none in this stretch, so the guest ran past it.
        // No device or seam may see that exit.
        let overshot = self
            .run_loop
            .late
            .as_ref()
            .is_some_and(|late| late.bounded())
            && matches!(&result, Ok(exit) if !matches!(exit, VcpuExit::Intr | VcpuExit::Debug(_)));
        if let Some(clock) = &mut self.exit_clock {
            match &result {
                _ if overshot => clock.resumed_without_exit(),
                Ok(VcpuExit::Intr | VcpuExit::Debug(_)) | Err(_) => clock.resumed_without_exit(),
                Ok(exit) => clock.exited(exit_device(exit), vcpu, self.seam.logging_ns()),
            }
        }
        if overshot {
            let exit = result.as_ref().map(ExitKind::of).ok();
            self.roll_back_late_search(&format!("an exit came first ({exit:?})"))?;
            return Ok(Entry::Kicked);
        }
        let exit = match result {
            Ok(VcpuExit::Intr) => None,
            // Not an exit: the guest is where it would have been. But the
            // logged interrupt window a replay runs to stands for that exit.
            // The search for a preemption in user code came back to it
            // (`vm::user_trap`).
            Ok(VcpuExit::IrqWindowOpen) if returning_from_trap => {
                if self.user_trap_returned()? {
                    Some(self.reach_logged_stop()?)
                } else {
                    self.run_loop.at_exit = false;
                    return Ok(Entry::Kicked);
                }
            }
            Ok(VcpuExit::Debug(debug)) => match self.logged_stop(&debug)? {
                StopKind::Reached => Some(self.reach_logged_stop()?),
                StopKind::Searching => {
                    self.run_loop.at_exit = false;
                    return Ok(Entry::Kicked);
                }
                StopKind::Passing => {
                    self.logged_stop_made(false)?;
                    self.run_loop.at_exit = false;
                    self.debug.step_over_due = true;
                    self.advance_late_search()?;
                    return Ok(Entry::Kicked);
                }
                StopKind::Other => return self.debug_stop(&debug),
            },
            Ok(exit) => Some(ExitKind::of(&exit)),
            Err(error) if error.errno() == libc::EINTR => None,
            Err(error) => return Err(VmError::Run(error)),
        };
        self.run_loop.at_exit = exit.is_some();
        match exit {
            Some(exit) => self.handle_exit(exit),
            None => {
                self.debug.step_kicked = true;
                self.advance_late_search()?;
                Ok(Entry::Kicked)
            }
        }
    }

    /// The guest reached the logged stop it ran to: the exit it stands
    /// for.
    fn reach_logged_stop(&mut self) -> Result<ExitKind, VmError> {
        self.logged_stop_made(true)?;
        // A debugger's step that lands here is not shown as a stop of its
        // own: the exit comes first.
        self.debug.stepping_over = false;
        self.end_late_search();
        let reached = self.debug.logged_stop.take();
        self.apply_guest_debug(&self.debug.guest_debug)?;
        Ok(match reached {
            Some(LoggedStop::Preemption(_, instance)) => ExitKind::Preempted(instance),
            _ => ExitKind::InterruptWindow,
        })
    }

    /// Handles the running vCPU's VM exit, whose data KVM left in its
    /// `kvm_run`.
    fn handle_exit(&mut self, exit: ExitKind) -> Result<Entry, VmError> {
        self.run_loop.last_exit = Instant::now();
        self.run_loop.exitless_warned = false;
        self.run_loop.spin_watch.exited(self.run_loop.last_exit);
        self.run_loop.repeats.exited();
        self.run_loop.computed_ns = 0;
        if let Some(quanta) = &mut self.run_loop.chaos_quanta {
            quanta.next_stretch();
        }
        match exit {
            ExitKind::PortRead => self.port_read()?,
            ExitKind::PortWrite => self.port_write()?,
            ExitKind::MmioRead => self.mmio_read()?,
            ExitKind::MmioWrite => self.mmio_write()?,
            ExitKind::Halt => {
                self.report(Exit::Halt)?;
                return Ok(Entry::Exited { halted: true });
            }
            ExitKind::InterruptWindow => {
                if self.debug.logged_stop.opens_early(self.vcpu.place()?) {
                    // Not the logged window: the guest goes on to it.
                    tracing::debug!("logged window: KVM's window opened before it");
                    self.vcpu.request_interrupt_window(false);
                    self.run_loop.at_exit = false;
                    return Ok(Entry::Kicked);
                }
                self.report(Exit::InterruptWindow)?
            }
            ExitKind::MsrRead => self.msr_read()?,
            ExitKind::Preempted(instance) => {
                self.run_loop.preempted = true;
                self.report(Exit::Preempted(&instance))?
            }
            ExitKind::Shutdown => return Err(VmError::TripleFault { rip: self.rip() }),
            ExitKind::InternalError => return Err(self.internal_error()),
            ExitKind::FailEntry(reason) => return Err(VmError::FailEntry(reason)),
            ExitKind::Unexpected(exit) => return Err(VmError::UnexpectedExit(exit)),
        }
        Ok(Entry::Exited { halted: false })
    }

    /// At a kick of a recording: preempts the guest, as an exit of its own,
    /// if it has computed for the seam's quantum without an exit while a
    /// tick or another vCPU waits, and stands where a replay can find it
    /// again (see `preemption`): in a loop it never leaves by itself (a
    /// state seen at an earlier kick of this stretch), or, where the seam
    /// asks for it and this host stops guest user mode at breakpoints,
    /// anywhere else too, logged with the time it computed for (the
    /// replay's late search). In user mode it logs where the instruction
    /// is in guest memory, for a replay that finds it with an `int3`.
    /// Returns whether it did.
    fn preempt_if_due(&mut self) -> Result<bool, VmError> {
        let Some(quantum) = self.preemption_quantum() else {
            return Ok(false);
        };
        // A tick is scheduled, and after a quantum it is due; reading the
        // clock here would be an input at no place a replay finds.
        let waiting = self.cpus.is_some() || self.devices.next_tick_ns().is_some();
        if self.run_loop.last_exit.elapsed() < quantum
            || !waiting
            || !self.vcpu.ready_for_interrupt()
            || self.vcpu.delivering_an_event()?
        {
            return Ok(false);
        }
        let Some(place) = self.vcpu.stoppable_place()? else {
            return Ok(false);
        };
        let place_seen_before = self.run_loop.repeats.place_seen_before(place);
        // PVM preempts only loops: it stops guest user mode at no
        // breakpoint, so its replays find a place in user code with
        // `int3`s, which stop at every pass and would make a computation's
        // late search crawl (`vm::user_trap`).
        let may_end_here = self.run_loop.user_mode_stops && self.seam.preempts_computations();
        if !(place_seen_before || may_end_here)
            || !preemption::findable_instruction(&self.vcpu, &self.memory, place.rip)?
        {
            return Ok(false);
        }
        self.run_loop
            .written
            .gather(&self.vm_fd, &self.memory)
            .map_err(VmError::Kvm)?;
        let pages = self.run_loop.written.runs();
        let user_code = self.user_code_at(place.rip)?;
        let digest = preemption::digest(&self.vcpu, &self.memory, &pages, user_code.is_some())?;
        let in_a_loop = place_seen_before && self.run_loop.repeats.state_seen_before(place, digest);
        if !in_a_loop && !may_end_here {
            return Ok(false);
        }
        // A loop's search starts at the last exit; anything else's late.
        let ran_ns = (!in_a_loop).then_some(self.run_loop.computed_ns);
        tracing::debug!(
            "preempted at RIP {:#x}, {}, after {:?} without an exit ({ran_ns:?} ns computing)",
            place.rip,
            if in_a_loop {
                "in a loop"
            } else {
                "in a computation"
            },
            self.run_loop.last_exit.elapsed()
        );
        self.run_loop.written.clear();
        self.run_loop.at_exit = true;
        self.handle_exit(ExitKind::Preempted(Instance {
            pages,
            digest,
            ran_ns,
            user_code,
        }))?;
        Ok(true)
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
        let Some(limit) = self.run_loop.exitless_limit else {
            return Ok(());
        };
        if self.seam.delivery().preemptive() {
            return Ok(());
        }
        let now = Instant::now();
        let regs = self.vcpu.exit_registers()?;
        self.run_loop
            .spin_watch
            .sampled(vcpu::register_digest(&regs), now);
        let exitless = now.saturating_duration_since(self.run_loop.last_exit);
        // Reading the clock here would be an input at a point no replay can
        // find again; a tick is scheduled, and after `limit` it is due.
        let tick_scheduled = self.devices.next_tick_ns().is_some();
        if exitless < limit || !tick_scheduled {
            return Ok(());
        }
        if !self.vcpu.in_user_mode()? {
            let repeating = self.run_loop.spin_watch.repeating_for(now);
            if repeating < limit {
                return Ok(());
            }
            return Err(VmError::Exitless {
                seconds: exitless.as_secs(),
                repeating: repeating.as_secs(),
                states: self.run_loop.spin_watch.states(),
                rip: regs.rip,
                vcpu: self.cpus.as_ref().map(|cpus| cpus.scheduler.current()),
            });
        }
        if !self.run_loop.exitless_warned {
            let remedy = if self.seam.preemption_quantum().is_none() {
                "record with --preempt MS, which preempts a loop that waits (and with \
                 --preempt-computations a computation, on SVM and VMX hosts), or use `provm run`"
            } else if !self.run_loop.user_mode_stops {
                "this host's KVM (PVM) stops guest user mode at no breakpoint, so --preempt \
                 preempts here only loops that never end by themselves (a spin-wait), not \
                 a computation: record on an SVM or VMX host with --preempt-computations"
            } else if !self.seam.preempts_computations() {
                "--preempt preempts only a loop that never ends by itself (a spin-wait): \
                 record with --preempt-computations too, which preempts a computation"
            } else {
                "the kicks found it where it cannot be preempted (interrupts off, or in a \
                 repeated string instruction)"
            };
            tracing::warn!(
                "guest user code has computed for {} s without a VM exit (RIP {:#x}); while recording, \
                 other guest processes and timers wait until it makes a system call. \
                 If it is waiting for one of them, it will wait for ever: stop it with Ctrl-C; {remedy}",
                exitless.as_secs(),
                regs.rip
            );
            self.run_loop.exitless_warned = true;
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
        if apic_waits || self.devices.pic.lock().unwrap().has_pending_interrupt() {
            return Ok(true);
        }
        let tick = self.devices.next_tick_ns().ok_or(VmError::Stuck)?;
        let can_receive = self
            .devices
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
        let tick = self.devices.next_tick_ns()?;
        Some(Duration::from_nanos(
            tick.saturating_sub(self.seam.monotonic_ns()),
        ))
    }

    /// The guest's instruction pointer (0 if KVM cannot say).
    pub fn rip(&self) -> u64 {
        self.vcpu.exit_registers().map_or(0, |regs| regs.rip)
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
    use crate::vcpu::PioExit;

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
