//! The guest's CPU model, in one place and without KVM: the CPUID table
//! a guest gets and what provm hides of the host's (`hidden`), the named
//! baselines a trace can move between hosts with (`baseline`), the names
//! of feature bits (`baseline::feature_name`), whether a host can present
//! a recorded table (`check`), what the guest kernel needs where user space
//! reaches vector state it cannot save (`vector_state`), the CPU and kernel
//! arguments a guest of some number of vCPUs gets, decided once for the VMM
//! and its probe (`guest`), and the model as a trace's manifest records it,
//! with the checks a replay makes before it starts (`manifest`).
//!
//! Tables are `CpuidEntry` lists, the one form the VMM, its snapshots and
//! the trace share; `provm-vmm` converts them to and from KVM's
//! `kvm_cpuid_entry2` at its edge (`vcpu.rs`) and reads this host's
//! (`cpu_probe`).
//!
//! Modules, each using only those listed before it: `entry`, `hidden`,
//! `baseline`, `check`, `vector_state`, `guest`, `manifest`.

#![forbid(unsafe_code)]

pub mod baseline;
pub mod check;
mod entry;
pub mod guest;
pub mod hidden;
pub mod manifest;
pub mod vector_state;

pub use baseline::{Baseline, BaselineError};
pub use check::CpuProbe;
pub use entry::{CpuidEntry, Register};
pub use guest::{kernel_args, GuestCpu};
pub use hidden::{HiddenFeature, Platform};
pub use manifest::{check_here, recorded, table, CpuModel, CpuRefusal, PVM_HYPERVISOR};
