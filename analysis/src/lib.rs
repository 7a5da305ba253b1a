//! The instrumentation of provm replays, below the engine. A replay
//! re-executes the recorded guest on KVM with every input fixed; this crate
//! watches it without changing it: it reads the guest kernel's structures
//! at hardware breakpoints (see `guest`, `profile`), derives system calls
//! and process changes from them (`syscall`, `instrument`), names who owns
//! a guest page (`page_owner`), and hands them to analyses written against
//! one trait (`api`). The analyses themselves are features: the built-in
//! ones are provm's (src/analyses/).

#![forbid(unsafe_code)]

pub mod address_space;
pub mod api;
pub mod backtrace;
pub mod guest;
pub mod instrument;
pub mod maple;
pub mod page_owner;
pub mod profile;
pub mod syscall;

pub use api::{Analysis, ProcessEvent};
pub use instrument::Instrument;
pub use profile::KernelInfo;
