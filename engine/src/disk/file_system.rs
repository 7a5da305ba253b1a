//! The root file system of an image, read without mounting it (ext4-view):
//! what `export oci` takes from a recorded image, and what a container
//! wrote to its root, read from the run's kept overlay.

use ext4_view::{Ext4, Ext4Error, Ext4Read};
use std::path::Path;

use provm_vmm::disk::image::{BaseImage, ImageError};
use provm_vmm::disk::Disk;

use super::root::{self, RootError};

#[derive(Debug, thiserror::Error)]
pub enum FileSystemError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Root(#[from] RootError),
    #[error("cannot read the root file system {device}: {source}")]
    Ext4 { device: String, source: Ext4Error },
}

/// The ext4 file system the guest mounted from `device` (`/dev/vda` or
/// `/dev/vdaN`) of `image`.
pub fn open(mut image: BaseImage, device: &str) -> Result<Ext4, FileSystemError> {
    let (start, _) = root::extent(&mut image, device)?;
    Ext4::load(Box::new(Partition { image, start })).map_err(|source| FileSystemError::Ext4 {
        device: device.to_owned(),
        source,
    })
}

/// The root file system of the image at `path` (with its backing chain,
/// a kept overlay's), found as a run finds it.
pub fn open_root(path: &Path) -> Result<Ext4, FileSystemError> {
    let mut image = BaseImage::open(path)?;
    let device = root::find_root(&mut image)?.device();
    open(image, &device)
}

/// A partition of the image, as ext4-view reads it.
struct Partition {
    image: BaseImage,
    start: u64,
}

impl Ext4Read for Partition {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        Ok(self.image.read_at(self.start + start_byte, dst)?)
    }
}
