//! The agent protocol both sides speak: the host (provm) and the guest
//! agent. Its parts: the frames and their fields (`codec`), the messages
//! each way (`message`), the job and how it ended (`job`), the file trees
//! in transit (`tree`), the provenance records (`records`), the paths
//! both sides name files by (`paths`), and the pseudo-terminal each side
//! of a container's terminal opens (`pty`).
//!
//! Every field is written and read by hand (`codec`), so the agent needs no
//! serialisation library (it is copied into guest memory at every boot, so
//! every kilobyte counts).

// Every unsafe block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

mod codec;
mod job;
mod message;
pub mod paths;
pub mod pty;
pub mod records;
pub mod tree;

pub use codec::{DecodeError, FrameReader, HEADER_LEN, MAX_PAYLOAD};
pub use job::{Job, Outcome, Rlimit, WindowSize};
pub use message::{provenance_messages, GuestMessage, HostMessage};
pub use records::{FileVersion, Process, ProvRecord};
pub use tree::{Entry, EntryContent};
