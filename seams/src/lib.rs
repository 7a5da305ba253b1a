//! provm's seams: the two implementations of the VMM's `Seam`, mirror images
//! of each other over one trace format (`provm_trace`'s).
//! - `Recorder`: at record time, appends every crossing to the event log.
//! - `Replayer`: at replay time, the clock and every input come from the
//!   log; every output the guest produces is compared with it, and the
//!   first mismatch is a divergence.
//!
//! Both turn a VM exit into the same event (`exit_event`), so what one
//! writes is what the other compares.

#![forbid(unsafe_code)]

mod clock;
pub mod delivery;
mod exit_event;
mod host_requests;
mod recorder;
mod replayer;
pub mod state_check;

pub use exit_event::exit_event;
pub use host_requests::{HostRequests, NO_HOST_REQUESTS};
pub use recorder::Recorder;
pub use replayer::{
    Checkpoint, Divergence, EventTap, Expected, ObservedError, Position, RecordedEnd, ReplayEnd,
    Replayer, StopHandler, Stopped,
};
