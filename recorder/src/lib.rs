//! provm's trace: the container format, the event log, snapshots, and the
//! recorder that writes them at the VMM's seam while the guest runs.

pub mod events;
pub mod format;
pub mod manifest;
pub mod recorder;
pub mod snapshot;
pub mod trace;

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
