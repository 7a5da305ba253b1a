//! `provm run --cpus N` with the vCPUs side by side: each vCPU on a host
//! thread of its own, in KVM_RUN without a lock, its exits handled under
//! one lock over the whole machine (QEMU's big lock) by the serial run
//! loop's own code (`Vm::handle_exit`, `Vm::deliver_interrupts`), with
//! that vCPU made the running one (`install`).
//!
//! Only where nothing is recorded or replayed: the host decides the
//! interleaving, and nothing logs it (`Vm::run_vcpus_in_parallel`).
//!
//! Each thread injects its vCPU's interrupts itself, before it enters the
//! guest (KVM wants a vCPU's ioctls from the thread that runs it). An
//! interrupt for another vCPU (an IPI, or a device's for vCPU 0) kicks
//! that vCPU out of the guest (a signal), or wakes it if it halted (a
//! condition variable). vCPU 0 takes the PIT's tick on the host's time, as
//! a serial run does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuExit;

use crate::devices::paravirt::SmpRequest;
use crate::host_core;
use crate::seam::HOST_INPUT_DUE;
use crate::vcpu::{self, Kicker, Vcpu};

use super::{Entry, ExitKind, Vm, VmError, VmEvent};

/// How long a halted vCPU waits before it looks again without being woken.
const HALT_POLL: Duration = Duration::from_millis(10);

struct Shared<'a> {
    machine: Mutex<Machine<'a>>,
    /// Signalled when a halted vCPU may have an interrupt, an AP starts,
    /// or the run ends.
    wake: Condvar,
    stop: AtomicBool,
    /// Each vCPU's thread (its `pthread_t`) while it is in the guest, 0
    /// outside, to kick it.
    in_guest: Vec<AtomicU64>,
}

struct Machine<'a> {
    vm: &'a mut Vm,
    /// Why the run ends, once a thread knows.
    outcome: Option<Result<VmEvent, VmError>>,
    /// By vCPU: halted with interrupts off (only an NMI wakes it).
    halted_for_good: Vec<bool>,
}

// SAFETY: a `Vm` is not `Send` for its kicker, whose timer signals the
// thread that created the VM, and for its vCPUs' `kvm_run` mappings. Under
// the lock a vCPU thread never arms the VM's kicker (it has its own), and
// of the vCPUs it uses only its own, made the running one by `install`.
unsafe impl Send for Machine<'_> {}

/// Where a vCPU's box lives, for its thread.
struct VcpuAddress(*mut Vcpu);

// SAFETY: the address is only dereferenced by the one thread given it
// (see `enter`).
unsafe impl Send for VcpuAddress {}

impl Vm {
    /// Makes vCPU `id` the running one, for the serial loop's code.
    fn install(&mut self, id: usize) {
        if let Some(cpus) = &mut self.cpus {
            cpus.switch(&mut self.vcpu, id);
        }
    }
}

/// Runs the VM's vCPUs side by side until one of them has an event (agent
/// output, reset, power-off) or an error; then stops them all, each after
/// handling the exit it was at, and returns that.
pub(super) fn run(vm: &mut Vm, deadline: Instant) -> Result<VmEvent, VmError> {
    let Some(cpus) = vm.cpus.as_mut() else {
        unreachable!("a parallel run has more than one vCPU");
    };
    let addresses = cpus.addresses(&mut vm.vcpu);
    let count = addresses.len();
    let shared = Shared {
        machine: Mutex::new(Machine {
            vm,
            outcome: None,
            halted_for_good: vec![false; count],
        }),
        wake: Condvar::new(),
        stop: AtomicBool::new(false),
        in_guest: (0..count).map(|_| AtomicU64::new(0)).collect(),
    };
    std::thread::scope(|scope| {
        for (id, address) in addresses.into_iter().enumerate() {
            let address = VcpuAddress(address);
            let shared = &shared;
            scope.spawn(move || {
                if let Err(error) = vcpu_thread(shared, id, &address, deadline) {
                    finish(shared, &mut shared.machine.lock().unwrap(), Err(error));
                }
            });
        }
    });
    let machine = shared.machine.into_inner().unwrap();
    machine
        .outcome
        .expect("a parallel run's threads end only with an outcome")
}

/// One vCPU's thread: handles its last exit, waits while it cannot run
/// (not started, or halted), injects its interrupts, enters the guest.
fn vcpu_thread(
    shared: &Shared,
    id: usize,
    vcpu: &VcpuAddress,
    deadline: Instant,
) -> Result<(), VmError> {
    // Nothing is replayed, so user-mode CPUID may name any core
    // (`host_core`): the host's scheduler places the vCPUs.
    host_core::unpin_vcpu();
    let mut kicker = Kicker::for_current_thread()?;
    let mut exit = None;
    loop {
        let mut machine = shared.machine.lock().unwrap();
        // An exit is handled even when the run is ending: KVM completes a
        // port or MMIO read with what the handler left in `kvm_run`.
        let (halted, relax) = match exit.take() {
            Some(exit) => after_exit(shared, &mut machine, id, exit)?,
            None => (false, false),
        };
        let Some(mut machine) = wait_until_runnable(shared, machine, id, halted, deadline)? else {
            return Ok(());
        };
        machine.vm.install(id);
        machine.vm.deliver_interrupts()?;
        // vCPU 0 takes the tick; the others come out at the kicker's
        // longest interval at the latest (`Kicker::arm`).
        let kick_after = match id {
            0 => machine.vm.until_next_tick().unwrap_or(Duration::MAX),
            _ => Duration::MAX,
        };
        drop(machine);
        if relax {
            // The guest waits for another CPU: let it have this core.
            std::thread::yield_now();
        }
        // SAFETY: pthread_self has no preconditions.
        let this_thread = unsafe { libc::pthread_self() };
        shared.in_guest[id].store(this_thread, Ordering::SeqCst);
        // A kick between here and KVM_RUN is lost; the kicker's timer
        // ends the entry soon after all the same.
        if shared.stop.load(Ordering::SeqCst) {
            shared.in_guest[id].store(0, Ordering::SeqCst);
            return Ok(());
        }
        kicker.arm(kick_after)?;
        let entered = enter(vcpu);
        kicker.disarm()?;
        shared.in_guest[id].store(0, Ordering::SeqCst);
        exit = entered?;
    }
}

/// Runs the vCPU at `vcpu` until an exit (or a kick: `None`).
fn enter(vcpu: &VcpuAddress) -> Result<Option<ExitKind>, VmError> {
    // SAFETY: the vCPU's box lives in the VM for the whole run (the VM
    // outlives the threads, and no vCPU is dropped or replaced while they
    // run). Other threads only move the box between `Vm::vcpu` and the
    // parked slots (`Cpus::switch`), never use what it holds: this vCPU is
    // used by its own thread alone, here outside the lock and through the
    // VM (installed) under it.
    let vcpu = unsafe { &mut *vcpu.0 };
    match vcpu.run() {
        Ok(VcpuExit::Intr) => Ok(None),
        Ok(exit) => Ok(Some(ExitKind::of(&exit))),
        Err(error) if error.errno() == libc::EINTR => Ok(None),
        Err(error) => Err(VmError::Run(error)),
    }
}

/// The serial loop's steps after an exit of vCPU `id`, under the lock:
/// the handler, the SMP kernel's requests, a reset, agent output, frames,
/// the host's input for the agent; then kicks the vCPUs that have an
/// interrupt now. Returns whether the
/// vCPU halted, and whether it spins waiting for another.
fn after_exit(
    shared: &Shared,
    machine: &mut Machine,
    id: usize,
    exit: ExitKind,
) -> Result<(bool, bool), VmError> {
    let vm = &mut *machine.vm;
    vm.install(id);
    let waited = waiting(vm);
    let halted = match vm.handle_exit(exit)? {
        Entry::Exited { halted } => halted,
        Entry::Kicked | Entry::Debug(_) => false,
    };
    let request = vm.devices.smp_ports.lock().unwrap().take_request();
    let relax = matches!(request, Some(SmpRequest::Relax));
    if let Some(SmpRequest::StartAp { block }) = request {
        vm.start_ap(block)?;
        shared.wake.notify_all();
    }
    if let Some(net) = &vm.devices.net {
        net.lock().unwrap().receive_frames();
    }
    if vm.devices.i8042.lock().unwrap().take_reset_request() {
        finish(shared, machine, Ok(VmEvent::Reset));
        return Ok((halted, relax));
    }
    let output = vm.devices.console.lock().unwrap().take_from_guest();
    if !output.is_empty() {
        vm.seam.agent_output(&output);
        finish(shared, machine, Ok(VmEvent::AgentOutput(output)));
        return Ok((halted, relax));
    }
    // After an exit, as the serial loop asks (a signal for the command).
    if vm.seam.host_input_due() {
        finish(
            shared,
            machine,
            Err(VmError::Stopped(HOST_INPUT_DUE.into())),
        );
        return Ok((halted, relax));
    }
    kick_the_interrupted(shared, machine.vm, id, &waited);
    Ok((halted, relax))
}

/// By vCPU: whether an interrupt waits for it.
fn waiting(vm: &Vm) -> Vec<bool> {
    let Some(cpus) = &vm.cpus else {
        return Vec::new();
    };
    let pic_waits = vm.devices.pic.lock().unwrap().has_pending_interrupt();
    (0..cpus.apics.len())
        .map(|cpu| cpus.interrupt_waits(cpu, pic_waits))
        .collect()
}

/// Kicks out of the guest, or wakes, every vCPU but `id` for which an
/// interrupt waits that did not wait before (`waited`). One that waited
/// already knows: it asked for an interrupt window, or halted with
/// interrupts off, and a kick would only cost it an entry.
fn kick_the_interrupted(shared: &Shared, vm: &Vm, id: usize, waited: &[bool]) {
    let mut any = false;
    for (other, waits) in waiting(vm).into_iter().enumerate() {
        if other != id && waits && !waited[other] {
            kick(shared, other);
            any = true;
        }
    }
    if any {
        shared.wake.notify_all();
    }
}

fn kick(shared: &Shared, id: usize) {
    let thread = shared.in_guest[id].load(Ordering::SeqCst);
    if thread != 0 {
        vcpu::kick_thread(thread);
    }
}

/// Ends the run with `outcome` (the first one; a second agent output is
/// added to the first, not lost) and stops every vCPU.
fn finish(shared: &Shared, machine: &mut Machine, outcome: Result<VmEvent, VmError>) {
    match (&mut machine.outcome, outcome) {
        (None, outcome) => machine.outcome = Some(outcome),
        (Some(Ok(VmEvent::AgentOutput(first))), Ok(VmEvent::AgentOutput(more))) => {
            first.extend(more)
        }
        (Some(_), _) => {}
    }
    shared.stop.store(true, Ordering::SeqCst);
    shared.wake.notify_all();
    (0..shared.in_guest.len()).for_each(|id| kick(shared, id));
}

/// Waits, under the lock, until vCPU `id` may enter the guest: started,
/// and not halted, or woken by an interrupt. `None` when the run ends.
fn wait_until_runnable<'a, 'b>(
    shared: &'a Shared<'b>,
    mut machine: MutexGuard<'a, Machine<'b>>,
    id: usize,
    mut halted: bool,
    deadline: Instant,
) -> Result<Option<MutexGuard<'a, Machine<'b>>>, VmError> {
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if Instant::now() >= deadline {
            // This vCPU's RIP: the installed one may be in the guest on its
            // own thread, where reading it would wait for its next exit.
            machine.vm.install(id);
            return Err(VmError::Timeout {
                rip: machine.vm.rip(),
            });
        }
        let vm = &mut *machine.vm;
        let cpus = vm.cpus.as_ref().expect("a parallel run has vCPUs");
        let started = cpus.scheduler.started(id);
        if started && halted {
            if id == 0 {
                vm.poll_timer();
            }
            let pic_waits = id == 0 && vm.devices.pic.lock().unwrap().has_pending_interrupt();
            let cpus = vm.cpus.as_ref().expect("a parallel run has vCPUs");
            let (waits, nmi_waits) = (
                cpus.interrupt_waits(id, pic_waits),
                cpus.apics[id].nmi_pending(),
            );
            vm.install(id);
            let for_good = !vm.vcpu.interrupts_enabled();
            if nmi_waits || (waits && !for_good) {
                halted = false;
                machine.halted_for_good[id] = false;
            } else if for_good {
                machine.halted_for_good[id] = true;
                let vm = &*machine.vm;
                let cpus = vm.cpus.as_ref().expect("a parallel run has vCPUs");
                let all = (0..machine.halted_for_good.len())
                    .all(|cpu| !cpus.scheduler.started(cpu) || machine.halted_for_good[cpu]);
                if all {
                    finish(shared, &mut machine, Ok(VmEvent::Halted));
                    return Ok(None);
                }
            }
        }
        if started && !halted {
            return Ok(Some(machine));
        }
        let timeout = match id {
            0 if started => machine.vm.until_next_tick().unwrap_or(HALT_POLL),
            _ => HALT_POLL,
        };
        machine = shared.wake.wait_timeout(machine, timeout).unwrap().0;
    }
}
