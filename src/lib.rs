//! provm: runs a command inside a Linux VM on its own KVM VMM.

pub mod blame;
pub mod cpu_model;
pub mod digest;
pub mod disk;
pub mod export;
pub mod fast_start;
pub mod fork;
pub mod gdb;
pub mod holes;
pub mod host_paths;
pub mod initramfs;
pub mod inspect;
pub mod kernel;
pub mod machine;
pub mod pinning;
pub mod provenance;
pub mod query;
pub mod record;
pub mod replay;
pub mod repro;
pub mod run;
pub mod seen_images;
pub mod session;
pub mod snapshot;
pub mod utc;
