//! Which disk the guest gets, and how the user's image is protected: the
//! command's decisions, made here on top of the machine's image access
//! (`provm_vmm::disk`, which opens images read-only and serves an overlay
//! as the guest's disk). Here provm finds the root file system on the image
//! (`root`) and decides where the overlay goes and whether it is kept
//! (`overlay`).

pub mod overlay;
mod reader;
pub mod root;
