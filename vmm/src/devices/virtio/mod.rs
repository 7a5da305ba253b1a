//! virtio over the MMIO transport: the block device and the agent's console.

pub mod block;
pub mod console;
pub mod mmio;
