//! The end-to-end tests: provm's binary and library on the real guest,
//! one module per capability.
//!
//! One test binary rather than one per file: each linked the whole of
//! provm, and building 19 of them took 72 s of CI's 2 cores.

mod analysis;
mod blame;
mod container_images;
mod containerd;
mod corpus;
mod data_io;
mod diff;
mod docker;
mod docs;
mod e2e;
mod fork;
mod gdb;
mod golden;
mod guest_environment;
mod host_paths;
mod layering;
mod net;
mod parquet;
mod preemption;
mod provenance;
mod query;
mod record_replay;
mod reproducibility;
mod ro_crate;
mod runtime;
mod slurm;
mod smp;
mod smp_workloads;
mod state_check;
mod test_beds;
mod vector_state;

// Shared with the benches, which build on the same helpers.
#[path = "../common/mod.rs"]
mod common;
