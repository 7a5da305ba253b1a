//! The vCPUs of a guest with more than one, besides the one running: their
//! KVM vCPUs, their local APICs, and the scheduler that picks the one that
//! runs (`crate::scheduler`).
//!
//! The running vCPU sits in `Vm::vcpu`, where all of the run loop finds it;
//! a switch swaps it with a parked one. So a single-vCPU VM, which has no
//! `Cpus`, runs exactly as it always did.

use kvm_ioctls::{Kvm, VmFd};
use provm_cpu_model::GuestCpu;
use serde::{Deserialize, Serialize};

use crate::devices::apic::{Ipi, IpiKind, LocalApic, APIC_BASE, APIC_SIZE};
use crate::devices::persist::Persist;
use crate::scheduler::{Next, Reason, Scheduler, SchedulerState};
use crate::vcpu::{Vcpu, VcpuError, VcpuState};

use super::VmError;

pub struct Cpus {
    pub scheduler: Scheduler,
    /// By vCPU index (= APIC ID).
    pub apics: Vec<LocalApic>,
    /// By vCPU index; the running one's slot is empty.
    parked: Vec<Option<Box<Vcpu>>>,
}

/// The vCPUs beyond vCPU 0 in a snapshot (`VmState::cpus`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpusState {
    pub scheduler: SchedulerState,
    pub apics: Vec<LocalApic>,
    /// vCPUs 1 to N-1 (vCPU 0 is `VmState::vcpu`).
    pub vcpus: Vec<VcpuState>,
}

impl Cpus {
    /// vCPUs 1 to `count - 1` of a new VM, each with its CPUID of `cpu`;
    /// vCPU 0 is the VM's own. Enables every APIC.
    pub fn create(
        kvm: &Kvm,
        vm: &VmFd,
        cpu: &GuestCpu,
        count: u8,
        boot_vcpu: &Vcpu,
    ) -> Result<Self, VmError> {
        boot_vcpu.enable_apic(APIC_BASE, true)?;
        let mut parked = vec![None];
        for id in 1..count {
            let vcpu = Vcpu::with_id(kvm, vm, id, &cpu.vcpu_table(id))?;
            vcpu.enable_apic(APIC_BASE, false)?;
            parked.push(Some(Box::new(vcpu)));
        }
        Ok(Cpus {
            scheduler: Scheduler::new(count.into()),
            apics: (0..count).map(LocalApic::new).collect(),
            parked,
        })
    }

    /// The vCPUs of a restored VM, in `state`'s state; vCPU 0 is the VM's
    /// own, restored by the caller. Leaves `state`'s running vCPU to be
    /// swapped in (`Vm::restore`).
    pub fn restore(kvm: &Kvm, vm: &VmFd, state: &CpusState) -> Result<Self, VmError> {
        let count = state.vcpus.len() + 1;
        let mut parked = vec![None];
        for (index, saved) in state.vcpus.iter().enumerate() {
            let vcpu = Vcpu::with_id(kvm, vm, (index + 1) as u8, &saved.cpuid)?;
            vcpu.restore(kvm, saved)?;
            parked.push(Some(Box::new(vcpu)));
        }
        let mut apics: Vec<LocalApic> = (0..count as u8).map(LocalApic::new).collect();
        if state.apics.len() != count || state.scheduler.cpus.len() != count {
            return Err(crate::devices::persist::InvalidState::new(
                "cpus",
                "apics",
                state.apics.len(),
                "not one per vCPU",
            )
            .into());
        }
        for (apic, saved) in apics.iter_mut().zip(&state.apics) {
            apic.restore(saved)?;
        }
        Ok(Cpus {
            scheduler: Scheduler::restore(state.scheduler.clone()),
            apics,
            parked,
        })
    }

    /// The state of every vCPU but vCPU 0, `running` being the one in the
    /// VM's hands (its index is the scheduler's current).
    pub fn save(&mut self, kvm: &Kvm, running: &mut Vcpu) -> Result<CpusState, VcpuError> {
        let current = self.scheduler.current();
        let mut vcpus = Vec::new();
        for id in 1..self.parked.len() {
            let vcpu = match self.parked[id].as_deref_mut() {
                Some(parked) => parked,
                None => &mut *running,
            };
            if self.scheduler.started(id) || id == current {
                vcpu.finish_pending_exit();
            }
            vcpus.push(vcpu.save(kvm)?);
        }
        Ok(CpusState {
            scheduler: self.scheduler.save(),
            apics: self.apics.clone(),
            vcpus,
        })
    }

    /// `Vm::resume_as_saved` for the parked vCPUs that have run, at once
    /// on restore: a parked vCPU is looked at (can it take an interrupt,
    /// is its HLT for good?) before it next runs, and its `kvm_run` must
    /// say what its last exit said, as the saved VM's did.
    pub fn resume_as_saved(&mut self) {
        for (id, vcpu) in self.parked.iter_mut().enumerate() {
            if let Some(vcpu) = vcpu.as_mut().filter(|_| self.scheduler.started(id)) {
                vcpu.finish_pending_exit();
            }
        }
    }

    /// vCPU 0's state when it is parked (else `running` is vCPU 0).
    pub fn boot_vcpu_mut<'a>(&'a mut self, running: &'a mut Vcpu) -> &'a mut Vcpu {
        match self.parked[0].as_deref_mut() {
            Some(parked) => parked,
            None => running,
        }
    }

    /// Swaps `running` (the scheduler's current vCPU) for vCPU `to`.
    pub fn switch(&mut self, running: &mut Box<Vcpu>, to: usize) {
        let from = self.scheduler.current();
        if from == to {
            return;
        }
        let next = self.parked[to].take().expect("a parked vCPU");
        self.parked[from] = Some(std::mem::replace(running, next));
        self.scheduler.switched(to);
    }

    /// A parked vCPU, to start it.
    pub fn parked(&self, id: usize) -> Option<&Vcpu> {
        self.parked.get(id).and_then(Option::as_deref)
    }

    /// Takes parked vCPU `id` out, to run it (a restore's running vCPU).
    pub fn take_parked(&mut self, id: usize) -> Result<Box<Vcpu>, VmError> {
        self.parked
            .get_mut(id)
            .and_then(Option::take)
            .ok_or(VmError::NoSuchCpu(id as u32))
    }

    /// Parks vCPU `id`.
    pub fn park(&mut self, id: usize, vcpu: Box<Vcpu>) {
        self.parked[id] = Some(vcpu);
    }

    /// Who runs after the running vCPU's exit (`Scheduler::after_exit`);
    /// `pic_waits`: the PIC, wired to vCPU 0, has an interrupt for it.
    pub fn next_after(&mut self, reason: Reason, pic_waits: bool) -> Next {
        let apics = &self.apics;
        self.scheduler
            .after_exit(reason, |cpu| interrupt_waits(apics, cpu, pic_waits))
    }

    /// Whether an interrupt waits for vCPU `cpu` (`pic_waits`: the PIC's,
    /// for vCPU 0).
    pub fn interrupt_waits(&self, cpu: usize, pic_waits: bool) -> bool {
        interrupt_waits(&self.apics, cpu, pic_waits)
    }

    /// Every vCPU's address, by index, `running` being the scheduler's
    /// current (for a parallel run's threads: `super::parallel`).
    pub fn addresses(&mut self, running: &mut Vcpu) -> Vec<*mut Vcpu> {
        let current = self.scheduler.current();
        (0..self.parked.len())
            .map(|id| match self.parked[id].as_deref_mut() {
                Some(parked) => parked as *mut Vcpu,
                None if id == current => running as *mut Vcpu,
                None => unreachable!("only the running vCPU is not parked"),
            })
            .collect()
    }

    /// A read of the running vCPU's APIC page; false if `address` is not in it.
    pub fn mmio_read(&self, address: u64, data: &mut [u8]) -> bool {
        let Some(offset) = apic_offset(address) else {
            return false;
        };
        let value = self.apics[self.scheduler.current()].read(offset);
        let bytes = value.to_le_bytes();
        let len = data.len().min(4);
        data.fill(0);
        data[..len].copy_from_slice(&bytes[..len]);
        true
    }

    /// A write to the running vCPU's APIC page (an ICR write sends its
    /// IPI); false if `address` is not in it.
    pub fn mmio_write(&mut self, address: u64, data: &[u8]) -> bool {
        let Some(offset) = apic_offset(address) else {
            return false;
        };
        let mut bytes = [0u8; 4];
        let len = data.len().min(4);
        bytes[..len].copy_from_slice(&data[..len]);
        let current = self.scheduler.current();
        if let Some(ipi) = self.apics[current].write(offset, u32::from_le_bytes(bytes)) {
            self.send(ipi);
        }
        true
    }

    /// Routes an IPI from the running vCPU's APIC to its destinations.
    pub fn send(&mut self, ipi: Ipi) {
        let from = self.apics[self.scheduler.current()].id();
        let destinations = self
            .apics
            .iter_mut()
            .filter(|apic| apic.is_destination(ipi.to, from));
        match ipi.kind {
            IpiKind::Fixed => destinations.for_each(|apic| apic.accept(ipi.vector)),
            IpiKind::Nmi => destinations.for_each(LocalApic::accept_nmi),
            kind => tracing::warn!("APIC: {kind:?} IPI to {:?} not delivered", ipi.to),
        }
    }
}

fn interrupt_waits(apics: &[LocalApic], cpu: usize, pic_waits: bool) -> bool {
    apics[cpu].has_pending_interrupt() || (cpu == 0 && pic_waits)
}

/// The register offset of an address in the APIC page.
fn apic_offset(address: u64) -> Option<u64> {
    (APIC_BASE..APIC_BASE + APIC_SIZE)
        .contains(&address)
        .then(|| address - APIC_BASE)
}
