//! Which disk the guest gets, and how the user's image is protected: the
//! command's decisions, made here on top of the machine's image access
//! (`provm_vmm::disk`, which opens images read-only and serves an overlay
//! as the guest's disk). Here provm finds the root file system on the image
//! (`root`) and reads it without mounting (`file_system`), decides where
//! the overlay goes and whether it is kept (`overlay`), and identifies the image by every file of its backing chain,
//! checked at replay and embedded in a trace on request (`chain`).

pub mod chain;
pub mod file_system;
pub mod overlay;
mod reader;
pub mod root;
