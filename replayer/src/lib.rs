//! provm's replayer: the seam at replay time. The clock and every input come
//! from the trace's event log; every output the guest produces is compared
//! with it, and the first mismatch is a divergence.

mod replayer;

pub use replayer::{
    Checkpoint, Divergence, EventTap, Expected, Position, RecordedEnd, ReplayEnd, Replayer,
    StopHandler, Stopped,
};
