//! provm: runs a command inside a Linux VM on its own KVM VMM.

pub mod initramfs;
pub mod kernel;
pub mod provenance;
pub mod run;
pub mod session;
