//! The guest's devices. Every one runs on the vCPU thread, at the exit that
//! reached it: no device threads whose timing the guest could observe.

use std::sync::Arc;

pub mod apic;
pub mod cmos;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod i8042;
pub mod paravirt;
pub mod persist;
pub mod pic;
pub mod pit;
pub mod serial;
pub mod vector_state;
pub mod virtio;

/// An interrupt request line into the interrupt controller.
pub trait IrqLine: Send + Sync {
    /// Drives the line; the controller latches a request on a rising edge.
    fn set_level(&self, high: bool);

    /// One edge, for devices that signal events rather than states.
    fn pulse(&self) {
        self.set_level(true);
        self.set_level(false);
    }
}

pub type SharedIrqLine = Arc<dyn IrqLine>;
