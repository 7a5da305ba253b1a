//! Why a VM could not be built, restored or run on.

use std::path::PathBuf;

use provm_cpu_model::BaselineError;

use crate::boot::BootError;
use crate::bus::BusError;
use crate::devices::persist::InvalidState;
use crate::guest_debug::GuestDebugError;
use crate::memory::MemoryError;
use crate::vcpu::VcpuError;

use super::layout::KERNEL_SPACE;

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
    #[error("the snapshot's machine {} an input disk and the restored one {}: a snapshot restores into the machine it was taken of", if *.snapshot { "has" } else { "has no" }, if *.snapshot { "has none" } else { "has one" })]
    InputDiskMismatch { snapshot: bool },
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
    #[error("the recording preempted guest user code at RIP {rip:#x}, {why}: this host's KVM (PVM) stops guest user mode at no hardware breakpoint, which finds it; replay the trace on an SVM or VMX host")]
    UserPreemptionUnreachable { rip: u64, why: &'static str },
    #[error(
        "the replay's search for the preemption at RIP {rip:#x}, in guest user code, failed: {why}"
    )]
    UserTrap { rip: u64, why: String },

    #[error("cannot route the guest's reads of host-dependent MSRs to the VMM (KVM_CAP_X86_USER_SPACE_MSR / KVM_X86_SET_MSR_FILTER; Linux 5.10 or later): {0}")]
    MsrFilter(kvm_ioctls::Error),

    #[error("KVM_RUN failed: {0}")]
    Run(kvm_ioctls::Error),
    #[error(transparent)]
    GuestDebug(#[from] GuestDebugError),
}

impl From<InvalidState> for VmError {
    fn from(error: InvalidState) -> Self {
        VmError::DeviceState(Box::new(error))
    }
}
