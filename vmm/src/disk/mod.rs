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

/// A disk whose writes fail: the guest sees an I/O error, the disk stays
/// as it was. For a boot that must leave no trace on the disk (the booted
/// snapshot is later restored over a fresh overlay, so a write made before
/// it would be lost).
pub struct ReadOnly(pub Box<dyn Disk>);

impl Disk for ReadOnly {
    fn size(&self) -> u64 {
        self.0.size()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }

    fn write_at(&mut self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            "the disk is read-only while the guest boots",
        ))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk of sevens that must never be written.
    struct Sevens;

    impl Disk for Sevens {
        fn size(&self) -> u64 {
            1024
        }
        fn read_at(&mut self, _offset: u64, buf: &mut [u8]) -> io::Result<()> {
            buf.fill(7);
            Ok(())
        }
        fn write_at(&mut self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
            panic!("a write went through the read-only disk")
        }
        fn flush(&mut self) -> io::Result<()> {
            panic!("a flush went through the read-only disk")
        }
    }

    #[test]
    fn a_read_only_disk_reads_through_and_refuses_writes() {
        let mut disk = ReadOnly(Box::new(Sevens));
        assert_eq!(disk.size(), 1024);
        let error = disk.write_at(0, &[1; 512]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ReadOnlyFilesystem);
        disk.flush().unwrap();
        let mut read = [0; 512];
        disk.read_at(0, &mut read).unwrap();
        assert_eq!(read, [7; 512]);
    }
}
