//! One vCPU, whichever of the guest's it is: its CPU model, its entry state
//! (PVH for the boot vCPU, 64-bit mode for the others), its saved state,
//! interrupt injection and the kick that forces it out of KVM_RUN when a
//! timer tick is due. The VM holds the running one; the others wait in
//! `vm/cpus.rs`.

use std::cell::Cell;
use std::sync::Once;
use std::time::Duration;

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_fpu, kvm_interrupt, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_run, kvm_segment, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs, KVMIO,
    KVM_MAX_CPUID_ENTRIES, KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS,
};
use kvm_ioctls::{Cap, Kvm, SyncReg, VcpuExit, VcpuFd, VmFd};
use provm_cpu_model::{check as cpuid_check, CpuidEntry};
use serde::{Deserialize, Serialize};
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

use crate::boot::{EntryPoint, GDT, GDT_START};

/// RFLAGS.RF: the next instruction raises no instruction breakpoint.
pub const RESUME_FLAG: u64 = 1 << 16;

/// RFLAGS' status flags: CF, PF, AF, ZF, SF and OF, which many
/// instructions leave undefined (BT: OF, SF, AF and PF).
const STATUS_FLAGS: u64 = 0x8d5;

// kvm-ioctls has no wrapper for KVM_INTERRUPT, the injection ioctl for VMs
// without an in-kernel irqchip.
ioctl_iow_nr!(KVM_INTERRUPT, KVMIO, 0x86, kvm_interrupt);

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("cannot create the vCPU: {0}")]
    Create(kvm_ioctls::Error),
    #[error("KVM_GET_SUPPORTED_CPUID failed: {0}")]
    SupportedCpuid(kvm_ioctls::Error),
    #[error("KVM_SET_CPUID2 failed: {0}")]
    SetCpuid(kvm_ioctls::Error),
    #[error("KVM_GET_CPUID2 failed: {0}")]
    GetCpuid(kvm_ioctls::Error),
    #[error("the recorded CPUID table has {0} entries, more than KVM takes")]
    CpuidTooLarge(usize),
    #[error("this host cannot present the CPU the snapshot was taken on (KVM shows the guest a different CPUID; replay on a host with the recording's CPU):\n  {}", .0.join("\n  "))]
    CpuidNotPresented(Vec<String>),
    #[error("cannot set the vCPU's initial state ({what}): {source}")]
    InitialState {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("KVM_INTERRUPT of vector {vector:#x} failed: {source}")]
    Inject { vector: u8, source: std::io::Error },
    #[error("KVM_NMI failed: {0}")]
    Nmi(kvm_ioctls::Error),
    #[error(
        "the vCPU kick timer failed (without it a guest that makes no exits is never stopped): {0}"
    )]
    Kicker(std::io::Error),
    #[error("cannot {action} the vCPU's {what}: {source}")]
    State {
        action: &'static str,
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("KVM refuses to set MSR {index:#x} to the snapshot's {value:#x}")]
    Msr { index: u32, value: u64 },
    #[error("the snapshot's MSR {index:#x} holds {value:#x}, and this host's KVM has no such MSR (replay on a host whose kernel has it)")]
    MsrUnknownHere { index: u32, value: u64 },
    #[error("KVM cannot read MSR {0:#x}")]
    MsrUnreadable(u32),
    #[error("cannot probe how this host's KVM behaves: {0}")]
    Probe(kvm_ioctls::Error),
    #[error("this host's KVM behaved unexpectedly in a probe: {0}")]
    ProbeExit(String),
}

/// Everything KVM holds for the vCPU, as a snapshot needs it. A change here
/// changes the snapshot: a new machine version (`crate::machine_version`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    /// The CPUID the guest saw (KVM_GET_CPUID2), set again on restore.
    pub cpuid: Vec<CpuidEntry>,
    pub(crate) regs: kvm_regs,
    pub(crate) sregs: kvm_sregs,
    pub(crate) xsave: kvm_xsave,
    pub(crate) events: kvm_vcpu_events,
    pub(crate) debug: kvm_debugregs,
    pub(crate) msrs: Vec<kvm_msr_entry>,
    /// XCR0, which KVM_SET_XSAVE does not carry.
    pub(crate) xcrs: kvm_xcrs,
    /// Runnable or halted: a vCPU snapshotted in HLT stays halted.
    pub(crate) mp_state: kvm_mp_state,
}

/// Whether the system registers KVM_GET_SREGS `read` are user mode's
/// (CPL 3); a failed read is an error, never a mode.
fn user_mode(read: Result<kvm_sregs, kvm_ioctls::Error>) -> Result<bool, VcpuError> {
    let sregs = read.map_err(getting("system registers"))?;
    Ok(is_user_mode(&sregs))
}

/// Whether `sregs` are user mode's (CPL 3).
pub fn is_user_mode(sregs: &kvm_sregs) -> bool {
    sregs.cs.dpl == 3
}

/// The bytes of KVM's XSAVE area (`kvm_xsave::region`).
pub fn xsave_bytes(xsave: &kvm_xsave) -> &[u8] {
    // SAFETY: `region` is plain data, 4 KiB of u32; viewed as bytes.
    unsafe {
        std::slice::from_raw_parts(
            xsave.region.as_ptr().cast::<u8>(),
            std::mem::size_of_val(&xsave.region),
        )
    }
}

/// The bytes of KVM's XSAVE area, to fill.
pub fn xsave_bytes_mut(xsave: &mut kvm_xsave) -> &mut [u8] {
    // SAFETY: as `xsave_bytes`; any bytes are a valid `region`.
    unsafe {
        std::slice::from_raw_parts_mut(
            xsave.region.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(&xsave.region),
        )
    }
}

fn getting(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
    move |source| VcpuError::State {
        action: "read",
        what,
        source,
    }
}

fn setting(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
    move |source| VcpuError::State {
        action: "restore",
        what,
        source,
    }
}

pub struct Vcpu {
    pub fd: VcpuFd,
    /// The CPUID the guest sees: what KVM_GET_CPUID2 read back after
    /// KVM_SET_CPUID2 (on PVM, the host's own).
    pub cpuid: Vec<CpuidEntry>,
    /// What of the registers KVM can copy into kvm_run at every exit
    /// (KVM_CAP_SYNC_REGS: KVM_SYNC_X86_* bits), sparing a GET ioctl per
    /// exit: the general registers always, the system registers while
    /// asked (`sync_system_registers`).
    syncable: u64,
    /// What kvm_run holds of the state as it is now: what was synced at
    /// the last KVM_RUN, until a restore sets the registers anew.
    synced_now: Cell<u64>,
}

/// The CPUID KVM can offer a guest on this host (KVM_GET_SUPPORTED_CPUID).
pub fn supported_cpuid(kvm: &Kvm) -> Result<Vec<CpuidEntry>, VcpuError> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(VcpuError::SupportedCpuid)?;
    Ok(supported.as_slice().iter().map(from_kvm).collect())
}

/// An entry KVM reported, as the CPU model's `CpuidEntry`: this and
/// `to_kvm` are the model's edge with KVM (`provm-cpu-model` knows no KVM).
fn from_kvm(entry: &kvm_cpuid_entry2) -> CpuidEntry {
    CpuidEntry {
        function: entry.function,
        index: entry.index,
        flags: entry.flags,
        eax: entry.eax,
        ebx: entry.ebx,
        ecx: entry.ecx,
        edx: entry.edx,
    }
}

/// KVM's entry for one of the CPU model's, for KVM_SET_CPUID2.
fn to_kvm(entry: &CpuidEntry) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function: entry.function,
        index: entry.index,
        flags: entry.flags,
        eax: entry.eax,
        ebx: entry.ebx,
        ecx: entry.ecx,
        edx: entry.edx,
        ..Default::default()
    }
}

/// The entries of a table KVM_GET_CPUID2 filled. Linux 6.1 leaves `nent`
/// as passed in when the call succeeds (its kvm_vcpu_ioctl_get_cpuid2
/// updates it only on E2BIG; 6.12 updates it), so a table read
/// with room for KVM_MAX_CPUID_ENTRIES ends in the zeroed entries KVM did
/// not write. No real entry is all zero: leaf 0 names the vendor.
fn entries_read_back(table: &[kvm_cpuid_entry2]) -> Vec<CpuidEntry> {
    table
        .iter()
        .map(from_kvm)
        .filter(|entry| *entry != CpuidEntry::default())
        .collect()
}

impl Vcpu {
    /// Creates vCPU 0 and gives it `cpuid`.
    pub fn new(kvm: &Kvm, vm: &VmFd, cpuid: &[CpuidEntry]) -> Result<Self, VcpuError> {
        Self::with_id(kvm, vm, 0, cpuid)
    }

    /// Creates vCPU `id` and gives it `cpuid`.
    pub fn with_id(kvm: &Kvm, vm: &VmFd, id: u8, cpuid: &[CpuidEntry]) -> Result<Self, VcpuError> {
        let fd = vm.create_vcpu(id.into()).map_err(VcpuError::Create)?;
        let entries: Vec<kvm_cpuid_entry2> = cpuid.iter().map(to_kvm).collect();
        let table =
            CpuId::from_entries(&entries).map_err(|_| VcpuError::CpuidTooLarge(entries.len()))?;
        fd.set_cpuid2(&table).map_err(VcpuError::SetCpuid)?;
        let effective = fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(VcpuError::GetCpuid)?;
        let mut vcpu = Vcpu {
            fd,
            cpuid: entries_read_back(effective.as_slice()),
            syncable: 0,
            synced_now: Cell::new(0),
        };
        vcpu.sync_registers(kvm);
        Ok(vcpu)
    }

    /// Has KVM copy the general registers out at every exit, if it can.
    fn sync_registers(&mut self, kvm: &Kvm) {
        self.syncable = kvm.check_extension_int(Cap::SyncRegs) as u64
            & u64::from(KVM_SYNC_X86_REGS | KVM_SYNC_X86_SREGS);
        if self.syncable & u64::from(KVM_SYNC_X86_REGS) != 0 {
            self.fd.set_sync_valid_reg(SyncReg::Register);
        }
    }

    /// Has KVM copy the system registers out at every exit too, if it can,
    /// or stop: for a guest that single-steps, where each step reads them
    /// (an ioctl each, which is the larger part of a step's cost on PVM,
    /// whose every vCPU ioctl reads an MSR of its own host); not at every
    /// exit of a run, which would only pay for the copy.
    pub fn sync_system_registers(&mut self, sync: bool) {
        if self.syncable & u64::from(KVM_SYNC_X86_SREGS) == 0 {
            return;
        }
        if sync {
            self.fd.set_sync_valid_reg(SyncReg::SystemRegister);
        } else {
            self.fd.clear_sync_valid_reg(SyncReg::SystemRegister);
        }
    }

    /// Enters the guest (KVM_RUN) until its next exit. KVM copies what is
    /// synced into kvm_run as it returns, whatever the result.
    pub fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        self.synced_now.set(self.fd.get_kvm_run().kvm_valid_regs);
        self.fd.run()
    }

    fn synced(&self, what: u32) -> bool {
        self.synced_now.get() & u64::from(what) != 0
    }

    /// Where the guest is at the exit the last KVM_RUN returned.
    pub fn place(&self) -> Result<Place, VcpuError> {
        Ok(place_of(&self.exit_registers()?))
    }

    /// Like `place`, at an OUT exit on a host that reports the OUT itself:
    /// the place past it, where PVM reports it (see `port_exit`).
    pub fn place_past_out(&self, memory: &crate::memory::GuestMemory) -> Result<Place, VcpuError> {
        let mut regs = self.exit_registers()?;
        regs.rip += self.out_instruction_len(memory, regs.rip).unwrap_or(0);
        Ok(place_of(&regs))
    }

    /// The general registers at the last exit (until the guest runs on).
    pub fn exit_registers(&self) -> Result<kvm_regs, VcpuError> {
        if self.synced(KVM_SYNC_X86_REGS) {
            Ok(self.fd.sync_regs().regs)
        } else {
            self.fd.get_regs().map_err(getting("registers"))
        }
    }

    /// Sets RFLAGS to `rflags` at the last exit.
    pub fn set_exit_flags(&self, rflags: u64) -> Result<(), VcpuError> {
        let regs = kvm_regs {
            rflags,
            ..self.exit_registers()?
        };
        // kvm_run's copy is the state before this one.
        self.synced_now
            .set(self.synced_now.get() & !u64::from(KVM_SYNC_X86_REGS));
        self.fd.set_regs(&regs).map_err(setting("registers"))
    }

    /// The system registers at the last exit (until the guest runs on).
    pub fn exit_system_registers(&self) -> Result<kvm_sregs, VcpuError> {
        if self.synced(KVM_SYNC_X86_SREGS) {
            Ok(self.fd.sync_regs().sregs)
        } else {
            self.system_registers()
        }
    }

    /// The PVH entry state: 32-bit protected mode, paging off, flat segments,
    /// EBX pointing at the start info.
    pub fn enter_pvh(&self, entry: EntryPoint) -> Result<(), VcpuError> {
        let state_error = |what| move |source| VcpuError::InitialState { what, source };
        let mut sregs = self.fd.get_sregs().map_err(state_error("sregs"))?;
        flat_segments(&mut sregs, segment(1, 0xb));
        sregs.idt.base = 0;
        sregs.idt.limit = 0;
        sregs.cr0 = 0x11; // PE | ET
        sregs.cr4 = 0;
        sregs.efer = 0;
        self.fd.set_sregs(&sregs).map_err(state_error("sregs"))?;

        let regs = kvm_regs {
            rip: entry.entry.0,
            rbx: entry.start_info.0,
            rflags: 0x2,
            ..Default::default()
        };
        self.fd.set_regs(&regs).map_err(state_error("regs"))?;

        // The power-on values of the x87 control word and MXCSR.
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        self.fd.set_fpu(&fpu).map_err(state_error("fpu"))
    }

    /// Enables the local APIC the VMM emulates, at `base` (KVM shows the
    /// guest the APIC's CPUID bit only while it is enabled); `boot` marks
    /// the bootstrap processor.
    pub fn enable_apic(&self, base: u64, boot: bool) -> Result<(), VcpuError> {
        const ENABLE: u64 = 1 << 11;
        const BOOT_PROCESSOR: u64 = 1 << 8;
        let state_error = |source| VcpuError::InitialState {
            what: "APIC base",
            source,
        };
        let mut sregs = self.fd.get_sregs().map_err(state_error)?;
        sregs.apic_base = base | ENABLE | if boot { BOOT_PROCESSOR } else { 0 };
        self.fd.set_sregs(&sregs).map_err(state_error)
    }

    /// An AP's start in 64-bit mode, as the guest kernel asked for it (see
    /// `devices::paravirt::StartBlock`): at `entry` under page table `cr3`,
    /// with flat segments; the code there loads its own GDT and IDT.
    pub fn enter_long_mode(&self, entry: u64, cr3: u64) -> Result<(), VcpuError> {
        let state_error = |what| move |source| VcpuError::InitialState { what, source };
        let mut sregs = self.fd.get_sregs().map_err(state_error("sregs"))?;
        let code = kvm_segment {
            l: 1,
            db: 0,
            ..segment(1, 0xb)
        };
        flat_segments(&mut sregs, code);
        sregs.cr0 = 0x8000_0031; // PG | NE | ET | PE
        sregs.cr3 = cr3;
        // NXE too: the kernel's page tables set NX, a reserved bit without it.
        sregs.efer = 0xd00; // NXE | LMA | LME
        sregs.cr4 = 0x20; // PAE
        self.fd.set_sregs(&sregs).map_err(state_error("sregs"))?;
        let regs = kvm_regs {
            rip: entry,
            rflags: 0x2,
            ..Default::default()
        };
        self.fd.set_regs(&regs).map_err(state_error("regs"))
    }

    /// Completes the instruction behind the last exit without running the
    /// guest any further (KVM_RUN with immediate_exit). Until then an emulated
    /// port or MMIO access is half done inside KVM, where no GET ioctl sees it.
    pub fn finish_pending_exit(&mut self) {
        self.fd.set_kvm_immediate_exit(1);
        // Returns EINTR at once, having completed the pending access.
        let _ = self.run();
        self.fd.set_kvm_immediate_exit(0);
    }

    /// The vCPU's architectural state; call `finish_pending_exit` first.
    pub fn save(&self, kvm: &Kvm) -> Result<VcpuState, VcpuError> {
        let fd = &self.fd;
        Ok(VcpuState {
            cpuid: self.cpuid.clone(),
            regs: fd.get_regs().map_err(getting("registers"))?,
            sregs: fd.get_sregs().map_err(getting("system registers"))?,
            xsave: self.vector_registers()?,
            events: fd.get_vcpu_events().map_err(getting("pending events"))?,
            debug: fd.get_debug_regs().map_err(getting("debug registers"))?,
            msrs: self.readable_msrs(kvm)?,
            xcrs: fd.get_xcrs().map_err(getting("XCRs"))?,
            mp_state: fd.get_mp_state().map_err(getting("MP state"))?,
        })
    }

    /// Every MSR KVM lists that reads back, one at a time: some in the list
    /// are not readable on every host, and one failure stops a batch read.
    fn readable_msrs(&self, kvm: &Kvm) -> Result<Vec<kvm_msr_entry>, VcpuError> {
        let list = kvm.get_msr_index_list().map_err(getting("MSR list"))?;
        let mut msrs = Vec::new();
        for &index in list.as_slice() {
            if let Some(data) = self.read_msr(index)? {
                msrs.push(kvm_msr_entry {
                    index,
                    data,
                    ..Default::default()
                });
            }
        }
        Ok(msrs)
    }

    /// One MSR's value, `None` where KVM does not read it.
    fn read_msr(&self, index: u32) -> Result<Option<u64>, VcpuError> {
        let mut one = Msrs::from_entries(&[kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .expect("one MSR fits the FAM wrapper");
        let read = self.fd.get_msrs(&mut one).map_err(getting("MSRs"))?;
        Ok((read == 1).then(|| one.as_slice()[0].data))
    }

    /// Sets each saved MSR. KVM refuses to set some it lets be read (e.g.
    /// KVM's poll control without an in-kernel LAPIC); those are fine when
    /// the new vCPU already holds the saved value.
    ///
    /// An MSR this host's KVM does not list at all came from a recording
    /// host with a newer kernel (6.12 lists Hyper-V's 0x40000118, 6.1 does
    /// not). Held at 0, its reset value, the guest never wrote it (provm's
    /// guest sees no Hyper-V or KVM paravirtual leaves), so the machine is
    /// the same without it; any other value is refused by name.
    fn restore_msrs(&self, kvm: &Kvm, saved: &[kvm_msr_entry]) -> Result<(), VcpuError> {
        let listed = kvm.get_msr_index_list().map_err(getting("MSR list"))?;
        for entry in saved {
            if !listed.as_slice().contains(&entry.index) {
                if entry.data == 0 {
                    continue;
                }
                return Err(VcpuError::MsrUnknownHere {
                    index: entry.index,
                    value: entry.data,
                });
            }
            let mut one = Msrs::from_entries(&[*entry]).expect("one MSR fits the FAM wrapper");
            if self.fd.set_msrs(&one).map_err(setting("MSRs"))? == 1 {
                continue;
            }
            let read = self.fd.get_msrs(&mut one).map_err(getting("MSRs"))?;
            if read != 1 || one.as_slice()[0].data != entry.data {
                return Err(VcpuError::Msr {
                    index: entry.index,
                    value: entry.data,
                });
            }
        }
        Ok(())
    }

    /// One MSR's value.
    pub fn msr(&self, index: u32) -> Result<u64, VcpuError> {
        self.read_msr(index)?.ok_or(VcpuError::MsrUnreadable(index))
    }

    /// Puts back a state taken by `save`, on a vCPU created with
    /// `state.cpuid`. Refuses when KVM presents a different CPUID than the
    /// snapshot's, naming each difference.
    pub fn restore(&self, kvm: &Kvm, state: &VcpuState) -> Result<(), VcpuError> {
        let differences = cpuid_check::differences(&state.cpuid, &self.cpuid);
        if !differences.is_empty() {
            return Err(VcpuError::CpuidNotPresented(differences));
        }
        // kvm_run's copies are the state before this one.
        self.synced_now.set(0);
        let fd = &self.fd;
        fd.set_sregs(&state.sregs)
            .map_err(setting("system registers"))?;
        self.restore_msrs(kvm, &state.msrs)?;
        fd.set_regs(&state.regs).map_err(setting("registers"))?;
        fd.set_xcrs(&state.xcrs).map_err(setting("XCRs"))?;
        self.set_vector_registers(&state.xsave)?;
        fd.set_vcpu_events(&state.events)
            .map_err(setting("pending events"))?;
        fd.set_debug_regs(&state.debug)
            .map_err(setting("debug registers"))?;
        fd.set_mp_state(state.mp_state).map_err(setting("MP state"))
    }

    /// Delivers an external interrupt on the next KVM_RUN. Only valid when the
    /// last exit reported the guest ready for injection.
    pub fn inject(&self, vector: u8) -> Result<(), VcpuError> {
        let request = kvm_interrupt { irq: vector.into() };
        // SAFETY: KVM_INTERRUPT reads one kvm_interrupt, which lives across the call.
        let ret = unsafe { ioctl_with_ref(&self.fd, KVM_INTERRUPT(), &request) };
        if ret < 0 {
            return Err(VcpuError::Inject {
                vector,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Queues an NMI (an NMI IPI); KVM injects it when the guest does not
    /// block NMIs.
    pub fn inject_nmi(&self) -> Result<(), VcpuError> {
        self.fd.nmi().map_err(VcpuError::Nmi)
    }

    /// Whether the guest can take an interrupt now (IF set, no interrupt shadow).
    pub fn ready_for_interrupt(&mut self) -> bool {
        let run = self.fd.get_kvm_run();
        run.ready_for_interrupt_injection != 0 && run.if_flag != 0
    }

    /// Where a kick left the vCPU, if an instruction breakpoint there can
    /// stop a replay in the same state: not where RFLAGS.RF is set, as it
    /// is after the guest returns from a fault (or an interrupt) to the
    /// instruction it stands at, whose breakpoint then does not fire.
    pub fn stoppable_place(&self) -> Result<Option<Place>, VcpuError> {
        let regs = self.exit_registers()?;
        Ok((regs.rflags & RESUME_FLAG == 0).then(|| place_of(&regs)))
    }

    /// The system registers, as they are now.
    pub fn system_registers(&self) -> Result<kvm_sregs, VcpuError> {
        self.fd.get_sregs().map_err(getting("sregs"))
    }

    /// The system and vector registers, as they are now.
    pub fn system_and_vector_registers(&self) -> Result<(kvm_sregs, kvm_xsave), VcpuError> {
        Ok((self.system_registers()?, self.vector_registers()?))
    }

    /// The vector registers (KVM's XSAVE area), as they are now.
    pub fn vector_registers(&self) -> Result<kvm_xsave, VcpuError> {
        self.fd.get_xsave().map_err(getting("XSAVE area"))
    }

    /// Loads the vector registers from `xsave`, an XSAVE area in the
    /// standard form of `vector_registers`.
    pub fn set_vector_registers(&self, xsave: &kvm_xsave) -> Result<(), VcpuError> {
        // SAFETY: `xsave` is a whole kvm_xsave, the legacy 4 KiB size that
        // KVM_SET_XSAVE reads; KVM checks its contents.
        unsafe { self.fd.set_xsave(xsave) }.map_err(setting("XSAVE area"))
    }

    /// Whether KVM is part-way through delivering an event (an exception,
    /// an NMI or an interrupt it will inject at the next entry): a kick
    /// between two of its steps is no place to deliver another.
    pub fn delivering_an_event(&self) -> Result<bool, VcpuError> {
        let events = self
            .fd
            .get_vcpu_events()
            .map_err(getting("pending events"))?;
        Ok(events.exception.injected != 0
            || events.exception.pending != 0
            || events.interrupt.injected != 0
            || events.nmi.injected != 0
            || events.nmi.pending != 0)
    }

    /// Whether the guest runs user code (CPL 3) now. An error is one: read
    /// as kernel mode it would have a computing process taken for a
    /// spinning kernel, and the guest stopped.
    pub fn in_user_mode(&self) -> Result<bool, VcpuError> {
        user_mode(self.fd.get_sregs())
    }

    /// Whether the guest had interrupts enabled at the last exit.
    pub fn interrupts_enabled(&mut self) -> bool {
        self.fd.get_kvm_run().if_flag != 0
    }

    /// Asks KVM to exit as soon as the guest can take an interrupt.
    pub fn request_interrupt_window(&mut self, request: bool) {
        self.fd.get_kvm_run().request_interrupt_window = request.into();
    }

    /// The port I/O exit KVM_RUN just returned. kvm-ioctls passes on its
    /// data as one slice without the access size, which a string instruction
    /// (`rep ins/outs`: `count` accesses at one exit) needs. Call only after
    /// a `VcpuExit::IoIn` or `VcpuExit::IoOut`.
    pub fn pio_exit(&mut self) -> PioExit<'_> {
        let run = self.fd.get_kvm_run();
        // SAFETY: the last exit was KVM_EXIT_IO, so `io` is the live member.
        let io = unsafe { run.__bindgen_anon_1.io };
        let len = usize::from(io.size) * io.count as usize;
        // SAFETY: KVM puts the data `data_offset` bytes into the kvm_run
        // mapping, which kvm-ioctls maps whole for the vCPU's life (the very
        // slice its `VcpuExit::IoIn/IoOut` carries); the slice borrows the
        // vCPU, so no KVM_RUN can change it meanwhile.
        let data = unsafe {
            let start = (run as *mut kvm_run)
                .cast::<u8>()
                .add(io.data_offset as usize);
            std::slice::from_raw_parts_mut(start, len)
        };
        PioExit {
            port: io.port,
            // KVM reports 1, 2 or 4; never 0, which no access could split by.
            size: usize::from(io.size).max(1),
            data,
        }
    }

    /// The MMIO exit KVM_RUN just returned, read from kvm_run as
    /// `pio_exit` reads port I/O, so that `place` can be read before the
    /// exit's data is borrowed. Call only after a `VcpuExit::MmioRead` or
    /// `VcpuExit::MmioWrite`.
    pub fn mmio_exit(&mut self) -> MmioExit<'_> {
        let run = self.fd.get_kvm_run();
        // SAFETY: the last exit was KVM_EXIT_MMIO, so `mmio` is the live member.
        let mmio = unsafe { &mut run.__bindgen_anon_1.mmio };
        let len = (mmio.len as usize).min(mmio.data.len());
        MmioExit {
            address: mmio.phys_addr,
            data: &mut mmio.data[..len],
        }
    }

    /// The RDMSR exit KVM_RUN just returned, as `mmio_exit` reads MMIO.
    /// Call only after a `VcpuExit::X86Rdmsr`.
    pub fn msr_read_exit(&mut self) -> MsrReadExit<'_> {
        let run = self.fd.get_kvm_run();
        // SAFETY: the last exit was KVM_EXIT_X86_RDMSR, so `msr` is the live member.
        let msr = unsafe { &mut run.__bindgen_anon_1.msr };
        MsrReadExit {
            index: msr.index,
            data: &mut msr.data,
        }
    }
}

/// Where the guest was at a VM exit: its instruction pointer and a digest
/// of its general registers (see `register_digest`). Two exits that
/// look alike but come from different places or states are not the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    pub rip: u64,
    pub registers: u64,
}

fn place_of(regs: &kvm_regs) -> Place {
    Place {
        rip: regs.rip,
        registers: register_digest(regs),
    }
}

/// The RFLAGS that gives `regs` the register digest `digest` by other
/// status flags alone, if one does: 64 digests to try.
pub fn status_flags_giving(regs: &kvm_regs, digest: u64) -> Option<u64> {
    let others = regs.rflags & !STATUS_FLAGS;
    // Each subset of the status flags, by the carry-through trick.
    let mut subset = STATUS_FLAGS;
    loop {
        let rflags = others | subset;
        if register_digest(&kvm_regs { rflags, ..*regs }) == digest {
            return Some(rflags);
        }
        if subset == 0 {
            return None;
        }
        subset = (subset - 1) & STATUS_FLAGS;
    }
}

/// A cheap 64-bit digest (FxHash's step) of the 16 general registers, RIP
/// and RFLAGS: not cryptographic, it tells guest states apart. Each step is
/// a bijection of the word it adds, so states that differ in one register
/// always differ in their digest.
pub fn register_digest(regs: &kvm_regs) -> u64 {
    let words = [
        regs.rax,
        regs.rbx,
        regs.rcx,
        regs.rdx,
        regs.rsi,
        regs.rdi,
        regs.rsp,
        regs.rbp,
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rip,
        regs.rflags,
    ];
    words.iter().fold(0, |hash: u64, &word| {
        (hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
    })
}

/// An MMIO exit: the guest-physical address and the access's bytes.
pub struct MmioExit<'a> {
    pub address: u64,
    pub data: &'a mut [u8],
}

/// A read of an MSR the VMM answers: `data` takes the value.
pub struct MsrReadExit<'a> {
    pub index: u32,
    pub data: &'a mut u64,
}

/// A port I/O exit: accesses of `size` bytes each at `port`, their bytes one
/// after the other in `data`.
pub struct PioExit<'a> {
    pub port: u16,
    pub size: usize,
    pub data: &'a mut [u8],
}

fn segment(gdt_index: u16, type_: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: gdt_index * 8,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Flat segments from the boot GDT (`boot::GDT`): `code` in CS, the data
/// descriptor in the others, and its TSS in TR.
fn flat_segments(sregs: &mut kvm_sregs, code: kvm_segment) {
    let data = segment(2, 0x3);
    sregs.cs = code;
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = kvm_segment {
        s: 0,
        db: 0,
        g: 0,
        limit: 0x67,
        ..segment(3, 0xb)
    };
    sregs.gdt.base = GDT_START.0;
    sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
}

/// A POSIX timer that sends the vCPU thread a signal, so that KVM_RUN returns
/// (EINTR) when a timer interrupt is due even if the guest never exits on its
/// own, e.g. a user-space loop. It repeats every `RETRY` so that a signal that
/// lands just before KVM_RUN is entered only delays the kick.
pub struct Kicker {
    timer: libc::timer_t,
}

const RETRY: Duration = Duration::from_millis(10);

fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

/// Kicks `thread` out of KVM_RUN (KVM_RUN ends with EINTR), with the
/// kick's signal; elsewhere the signal does nothing. The thread must have
/// made a `Kicker` (which installs the handler).
pub fn kick_thread(thread: libc::pthread_t) {
    // SAFETY: the signal's handler is installed and does nothing; a thread
    // that has ended is refused (ESRCH), not harmed.
    unsafe { libc::pthread_kill(thread, kick_signal()) };
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

impl Kicker {
    /// Creates the timer for the calling thread, which must be the one that
    /// runs the vCPU.
    pub fn for_current_thread() -> Result<Self, VcpuError> {
        static HANDLER: Once = Once::new();
        let mut registered = Ok(());
        HANDLER.call_once(|| {
            registered = vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick)
                .map_err(|e| VcpuError::Kicker(std::io::Error::from_raw_os_error(e.errno())));
        });
        registered?;
        // SAFETY: sigevent is plain data; zero is a valid starting value.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = kick_signal();
        // SAFETY: gettid has no preconditions.
        event.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the duration of the call.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) } != 0 {
            return Err(VcpuError::Kicker(std::io::Error::last_os_error()));
        }
        Ok(Kicker { timer })
    }

    /// Kicks the vCPU `after` from now (at most `RETRY`), then every `RETRY`.
    /// An error must stop the run: without kicks a guest that makes no
    /// exits would never return to the loop that checks the deadline,
    /// Ctrl-C and the end of the log.
    pub fn arm(&mut self, after: Duration) -> Result<(), VcpuError> {
        self.set(after.clamp(Duration::from_micros(50), RETRY), RETRY)
    }

    /// Stops the kicks: outside KVM_RUN they would only interrupt the
    /// host's own system calls (EINTR).
    pub fn disarm(&mut self) -> Result<(), VcpuError> {
        self.set(Duration::ZERO, Duration::ZERO)
    }

    fn set(&mut self, first: Duration, every: Duration) -> Result<(), VcpuError> {
        let spec = libc::itimerspec {
            it_interval: timespec(every),
            it_value: timespec(first),
        };
        // SAFETY: the timer is ours and alive; spec is a valid itimerspec.
        if unsafe { libc::timer_settime(self.timer, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(VcpuError::Kicker(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Kicker {
    fn drop(&mut self) {
        // SAFETY: the timer was created by timer_create and is deleted once.
        unsafe { libc::timer_delete(self.timer) };
    }
}

fn timespec(duration: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: duration.as_secs() as libc::time_t,
        tv_nsec: duration.subsec_nanos() as libc::c_long,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_cpu_model::hidden::guest_cpuid;
    use provm_cpu_model::{Baseline, Platform};

    fn guest_vcpu(kvm: &Kvm, vm: &VmFd) -> Vcpu {
        let model = guest_cpuid(&supported_cpuid(kvm).unwrap(), Platform::detect());
        Vcpu::new(kvm, vm, &model).unwrap()
    }

    /// Measured on the SVM test bed (QEMU's TCG): after `bt $0xd,%ebx;
    /// jb`, a kick showed RFLAGS 0xa87 and a breakpoint stop at the same
    /// place 0x297, OF and AF being what BT leaves undefined.
    #[test]
    fn a_digest_is_found_again_through_other_status_flags_only() {
        let at_kick = kvm_regs {
            rbx: 0x152cca,
            rip: 0xffff_ffff_8109_c0d0,
            rflags: 0xa87,
            ..Default::default()
        };
        let logged = register_digest(&at_kick);
        let at_breakpoint = kvm_regs {
            rflags: 0x297,
            ..at_kick
        };
        assert_eq!(status_flags_giving(&at_breakpoint, logged), Some(0xa87));
        let no_flags = kvm_regs {
            rflags: 0x202,
            ..at_kick
        };
        assert_eq!(status_flags_giving(&no_flags, logged), Some(0xa87));
        // Another flag (IF, RF, TF) or another register is another state.
        for other in [0x87, 0x10a87, 0xb87] {
            let other = kvm_regs {
                rflags: other,
                ..at_kick
            };
            assert_eq!(status_flags_giving(&other, logged), None);
        }
        let other_register = kvm_regs {
            rbx: 0x152cc8,
            ..at_breakpoint
        };
        assert_eq!(status_flags_giving(&other_register, logged), None);
    }

    /// What this host records, it can replay: the guest's CPUID lacks no
    /// supported feature, and setting it again presents the same table.
    #[test]
    fn this_hosts_cpu_model_passes_its_own_replay_checks() {
        let kvm = Kvm::new().unwrap();
        let recorded = guest_vcpu(&kvm, &kvm.create_vm().unwrap()).cpuid;
        let presented = guest_vcpu(&kvm, &kvm.create_vm().unwrap()).cpuid;
        let supported = supported_cpuid(&kvm).unwrap();
        let lacking = cpuid_check::lacking(&recorded, &supported, &presented);
        assert!(lacking.is_empty(), "{lacking:?}");
        let again = Vcpu::new(&kvm, &kvm.create_vm().unwrap(), &recorded).unwrap();
        let differences = cpuid_check::differences(&recorded, &again.cpuid);
        assert!(differences.is_empty(), "{differences:?}");
    }

    /// KVM_GET_CPUID2 after KVM_SET_CPUID2 of an x86-64-v2 table, on this
    /// host. VMX/SVM present it as set. PVM (measured on an AMD EPYC host,
    /// 2026-11-25) reads back the vendor, signature, brand, cache and
    /// extended leaves as set, but leaf 1 ECX/EDX and leaf 7.0 (its
    /// subleaf count too) hold the host's own flags (AVX-512, TSC, APIC and
    /// all), and it adds the host's leaf 0xd subleaves; its guest user space, running natively,
    /// sees the host's whole CPUID besides. Hence no baseline on PVM.
    #[test]
    fn what_kvm_presents_of_a_baseline_table() {
        let kvm = Kvm::new().unwrap();
        let supported = supported_cpuid(&kvm).unwrap();
        let table = Baseline::X86_64V2.unchecked_table(&supported).unwrap();
        let set = guest_cpuid(&table, Platform::Hardware);
        let vcpu = Vcpu::new(&kvm, &kvm.create_vm().unwrap(), &set).unwrap();
        let differences = cpuid_check::differences(&set, &vcpu.cpuid);
        eprintln!("{:?}: {differences:#?}", Platform::detect());
        match Platform::detect() {
            Platform::Hardware => assert!(differences.is_empty(), "{differences:?}"),
            Platform::Pvm => {
                let host_flags = [
                    "CPUID leaf 0x1.0 Ecx:",
                    "CPUID leaf 0x1.0 Edx:",
                    "CPUID leaf 0x7.0 ",
                    "CPUID leaf 0xd.",
                ];
                assert!(differences.iter().any(|d| d.starts_with(host_flags[0])));
                for difference in &differences {
                    assert!(
                        host_flags.iter().any(|leaf| difference.starts_with(leaf)),
                        "{difference}"
                    );
                }
            }
        }
    }

    /// Every GET the snapshot makes has a SET that KVM accepts here,
    /// XCRs and MP state included.
    #[test]
    fn a_saved_vcpu_restores_into_a_new_one() {
        let kvm = Kvm::new().unwrap();
        let first = guest_vcpu(&kvm, &kvm.create_vm().unwrap());
        let state = first.save(&kvm).unwrap();
        let second = Vcpu::new(&kvm, &kvm.create_vm().unwrap(), &state.cpuid).unwrap();
        second.restore(&kvm, &state).unwrap();
        let again = second.save(&kvm).unwrap();
        assert_eq!(again.xcrs.xcrs[0].value, state.xcrs.xcrs[0].value);
        assert_eq!(again.mp_state.mp_state, state.mp_state.mp_state);
    }

    /// A snapshot from a newer KVM carries MSRs this one does not list:
    /// at their reset value they are left out, otherwise refused by name.
    #[test]
    fn msrs_this_kvm_lacks_restore_only_at_their_reset_value() {
        let kvm = Kvm::new().unwrap();
        let vcpu = guest_vcpu(&kvm, &kvm.create_vm().unwrap());
        let mut state = vcpu.save(&kvm).unwrap();
        // In Hyper-V's range, where newer kernels list more.
        let listed = kvm.get_msr_index_list().unwrap();
        let unlisted = (0x4000_0100u32..)
            .find(|index| !listed.as_slice().contains(index))
            .unwrap();
        state.msrs.push(kvm_msr_entry {
            index: unlisted,
            ..Default::default()
        });
        vcpu.restore(&kvm, &state).unwrap();
        state.msrs.last_mut().unwrap().data = 1;
        let refused = vcpu.restore(&kvm, &state).unwrap_err().to_string();
        let named = format!("MSR {unlisted:#x} holds 0x1");
        assert!(refused.contains(&named), "{refused}");
    }

    /// Linux 6.1 leaves `nent` as passed in: the zeroed tail is not CPUID.
    #[test]
    fn a_table_read_back_ends_at_the_last_entry_kvm_wrote() {
        let leaf0 = kvm_cpuid_entry2 {
            eax: 0xd,
            ebx: 0x6874_7541,
            ..Default::default()
        };
        let mut as_6_1_returns = vec![leaf0];
        as_6_1_returns.resize(KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2::default());
        assert_eq!(entries_read_back(&as_6_1_returns), [from_kvm(&leaf0)]);
    }

    /// A failed KVM_GET_SREGS is an error, not kernel mode (which would
    /// have a computing process taken for a spinning kernel).
    #[test]
    fn a_failed_read_of_the_mode_is_an_error_not_kernel_mode() {
        let failed = user_mode(Err(kvm_ioctls::Error::new(libc::EIO)))
            .unwrap_err()
            .to_string();
        assert!(failed.contains("system registers"), "{failed}");
        let mut sregs = kvm_sregs::default();
        assert!(!user_mode(Ok(sregs)).unwrap());
        sregs.cs.dpl = 3;
        assert!(user_mode(Ok(sregs)).unwrap());
    }

    /// A timer that cannot be armed is an error, not a run without kicks.
    #[test]
    fn a_kick_timer_that_fails_to_arm_says_so() {
        let mut kicker = Kicker::for_current_thread().unwrap();
        kicker.arm(Duration::from_millis(1)).unwrap();
        kicker.disarm().unwrap();
        // SAFETY: the timer is deleted once here; `kicker` is forgotten
        // below, so its Drop does not delete it again.
        unsafe { libc::timer_delete(kicker.timer) };
        let failed = kicker
            .arm(Duration::from_millis(1))
            .unwrap_err()
            .to_string();
        std::mem::forget(kicker);
        assert!(failed.contains("kick timer failed"), "{failed}");
    }

    #[test]
    fn a_snapshot_of_another_cpu_is_refused_by_name() {
        let kvm = Kvm::new().unwrap();
        let vcpu = guest_vcpu(&kvm, &kvm.create_vm().unwrap());
        let mut state = vcpu.save(&kvm).unwrap();
        let leaf = state.cpuid.iter_mut().find(|e| e.function == 0).unwrap();
        leaf.ebx ^= 1;
        let refused = vcpu.restore(&kvm, &state).unwrap_err().to_string();
        assert!(refused.contains("CPUID leaf 0x0.0 Ebx"), "{refused}");
        assert!(refused.contains("differing bit 0"), "{refused}");
    }
}
