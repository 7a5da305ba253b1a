//! provm's trace: the container format, the event log, the manifest and
//! outcome, the snapshot encoding, the reader and the writer. It links no KVM crate, so
//! every reader and analysis of a trace can run where KVM is not.

#![forbid(unsafe_code)]

pub mod event_log;
pub mod events;
pub mod format;
pub mod manifest;
pub mod page_digests;
pub mod reader;
pub mod snapshot;
pub mod writer;

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
