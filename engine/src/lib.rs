//! provm's engine: everything between the VMM's seams and the features.
//!
//! It assembles the machine (`machine`: the image's root, the overlay, the
//! kernel, the agent's initramfs, the CPU model), starts guests along one
//! path whatever their seam (`start`: the machine checked, the job, the
//! booted guest's cached snapshot from `fast_start` and `snapshot`, the
//! restore, the `session`, the job run and the power-off), and drives
//! them: `run` (nothing logged), `record` (every input logged into a
//! trace) and `replay` (the trace re-executed, every output checked), and
//! `recover` makes a trace of what a killed recording left. It has no
//! command line and prints nothing: what the user should hear goes out as
//! `tracing` events under the target [`NOTICE`], and errors are typed.
//! What watches a run from above plugs in as an [`observer::Observer`]:
//! provenance capture, and exit timing (`timing`), which every recording
//! keeps, whoever drives it.

#![deny(clippy::undocumented_unsafe_blocks)]

mod cached_section;
mod compress;
pub mod digest;
pub mod disk;
pub mod embedded;
pub mod explain;
pub mod fast_start;
pub mod holes;
pub mod host;
pub mod host_paths;
pub mod image;
pub mod initramfs;
pub mod kernel;
pub mod kernel_info;
pub mod machine;
pub mod net;
pub mod observer;
pub mod pinning;
pub mod record;
pub mod recover;
pub mod replay;
pub mod requests;
pub mod run;
pub mod seen_images;
pub mod session;
pub mod snapshot;
pub mod start;
pub mod timing;
pub mod transfer;
pub mod utc;

/// The `tracing` target of what the user should hear of a long step (a
/// first boot, a kernel build, an embedded image used): the command line
/// shows these as `provm: MESSAGE`, whatever the log level.
pub const NOTICE: &str = "provm::notice";

/// Tells the user something, as a [`NOTICE`] event.
#[macro_export]
macro_rules! notice {
    ($($arg:tt)*) => {
        tracing::info!(target: $crate::NOTICE, $($arg)*)
    };
}
