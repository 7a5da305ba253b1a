//! How this host's KVM behaves, measured at run time where hosts differ and
//! provm must decide: each probe runs a guest of a few bytes (`code_guest`)
//! and reports one verdict per host (`stability`, a test, holds them to it).
//!
//! - `port_exit`: where RIP stands at a port-write exit;
//! - `breakpoint_step`: whether a single step shows the guest its trap
//!   flag, and stepping with breakpoints where it does;
//! - `interrupt_window`: where the interrupt-window exit lands, a fact of
//!   the host that provm no longer decides by (a test only).

pub mod breakpoint_step;
pub(crate) mod code_guest;
// A measurement of the host, no longer a decision: see its header.
#[cfg(test)]
mod interrupt_window;
pub mod port_exit;
#[cfg(test)]
mod stability;
