//! provm's recorder: the VMM's seam at record time, appending every crossing
//! to a trace's event log (the format is `provm_trace`'s).

mod clock;
mod recorder;

pub use recorder::{exit_event, Recorder};
