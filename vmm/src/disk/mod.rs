//! The machine's disk: the [`Disk`] the virtio block device serves, and
//! image files opened as one (see `image`).

use std::io;

pub mod image;

/// A virtual disk: a byte-addressed store of fixed size.
pub trait Disk: Send {
    /// Size in bytes.
    fn size(&self) -> u64;
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    fn flush(&mut self) -> io::Result<()>;
}
