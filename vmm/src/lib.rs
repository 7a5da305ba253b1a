//! provm's virtual machine monitor: 1 to `mp_table::MAX_CPUS` vCPUs on KVM,
//! PVH boot of an ELF vmlinux, a userspace PIC and PIT (and, for more than
//! one vCPU, an xAPIC each) so that every interrupt is injected by the VMM
//! at a VM exit, and the few devices a command-running guest needs. The
//! vCPUs run one at a time, switched at VM exits (`scheduler`), except in
//! a run that nothing records (`Vm::run_vcpus_in_parallel`).
//!
//! The VMM knows nothing of recording; it exposes every boundary event through
//! one seam (see `seam.rs`).

#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(test)]
mod allocation_bound;
pub mod boot;
pub mod bus;
pub mod clock;
pub mod cpu_probe;
pub mod devices;
pub mod disk;
pub mod exit_timing;
pub mod guest_debug;
mod host_core;
pub mod logged_stop;
pub mod machine_version;
pub mod memory;
pub mod mp_table;
pub mod msr;
pub mod network;
pub mod paging;
pub mod preemption;
pub mod probes;
pub mod scheduler;
pub mod seam;
mod spin_watch;
pub mod state_digest;
pub mod user_trap;
pub mod vcpu;
pub mod vm;
