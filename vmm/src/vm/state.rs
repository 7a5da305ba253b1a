//! The VM's state at an exit: what a snapshot saves (every vCPU, every
//! device, the virtual time and the RAM) and what a state check digests.

use provm_cpu_model::CpuidEntry;
use serde::{Deserialize, Serialize};

use crate::devices::cmos::CmosState;
use crate::devices::i8042::I8042;
use crate::devices::paravirt::DoorbellState;
use crate::devices::persist::Persist;
use crate::devices::pic::Pic;
use crate::devices::pit::PitState;
use crate::devices::serial::SerialPortState;
use crate::devices::virtio::console::ConsoleState;
use crate::devices::virtio::mmio::TransportState;
use crate::memory::MemoryImage;
use crate::state_digest::{self, RegistersAtTscRate, StateDigest};
use crate::vcpu::VcpuState;

use super::{cpus, Vm, VmError};

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
    pub(super) vcpu: VcpuState,
    pub(super) pic: Pic,
    pub(super) pit: PitState,
    pub(super) cmos: CmosState,
    pub(super) serial: SerialPortState,
    pub(super) i8042: I8042,
    pub(super) doorbell: DoorbellState,
    pub(super) block: TransportState<()>,
    pub(super) console: TransportState<ConsoleState>,
    /// The network card, in machines that have one (from machine version 2
    /// on, with `--net`); absent, the state is machine version 1's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) net: Option<TransportState<()>>,
    /// The input disk, in machines that have one (from machine version 5
    /// on, when inputs go by disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) input_disk: Option<TransportState<()>>,
    /// The other vCPUs, their APICs and the schedule, in machines with more
    /// than one vCPU (machine version 3); absent, the machine has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cpus: Option<cpus::CpusState>,
    /// Whether the VM saves tasks' vector state in the canonical form
    /// (`Vm::canonical_vector_areas`): from machine version 6 on; absent,
    /// as KVM gives it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) canonical_vector_areas: bool,
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

    /// The vCPU that runs first when the snapshot is restored: the one the
    /// snapshot was taken on, which a booted guest's need not be vCPU 0 (its
    /// agent reported ready on whichever ran).
    pub fn running_vcpu(&self) -> usize {
        self.cpus.as_ref().map_or(0, |cpus| cpus.scheduler.current)
    }
}

impl VmState {
    /// Each device's saved state's digest, by name (`state_digest`).
    pub(super) fn device_digests(&self) -> Vec<(&'static str, u64)> {
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
        if let Some(input_disk) = &self.input_disk {
            digests.push(("input-disk", digest(input_disk)));
        }
        digests
    }
}

impl Vm {
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
            register_parts: state_digest::register_parts(&state.vcpu),
            registers_with_stale_events: state_digest::registers_with_stale_events(&state.vcpu),
            registers_at_tsc_rate: RegistersAtTscRate::of(&state.vcpu),
            devices: state.device_digests(),
        })
    }

    /// The vCPU's and the devices' state, with the virtual time given.
    pub(super) fn state_at(&mut self, clock_ns: u64) -> Result<VmState, VmError> {
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
            pic: self.devices.pic.lock().unwrap().save(),
            pit: self.devices.pit.lock().unwrap().save(),
            cmos: self.devices.cmos.lock().unwrap().save(),
            serial: self.devices.serial.lock().unwrap().save(),
            i8042: self.devices.i8042.lock().unwrap().save(),
            doorbell: self.devices.doorbell.lock().unwrap().save(),
            block: self.devices.block.lock().unwrap().save(),
            console: self.devices.console.lock().unwrap().save(),
            net: self
                .devices
                .net
                .as_ref()
                .map(|net| net.lock().unwrap().save()),
            input_disk: self
                .devices
                .input_disk
                .as_ref()
                .map(|disk| disk.lock().unwrap().save()),
            canonical_vector_areas: self.canonical_vector_areas,
        })
    }
}
