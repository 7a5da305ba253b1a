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

/// The size the input disk shows the guest, whatever its medium holds: a
/// guest booted with no medium is then the same machine as one restored
/// with any, so one booted snapshot serves every input.
pub const INPUT_DISK_BYTES: u64 = 1 << 40;

/// The medium of the input disk (`VmConfig::input_disk`), read-only: zeros
/// past its end (and with none at all, as when the guest boots), to
/// `INPUT_DISK_BYTES`.
pub struct InputMedium(pub Option<Box<dyn Disk>>);

impl Disk for InputMedium {
    fn size(&self) -> u64 {
        INPUT_DISK_BYTES
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let held = self.0.as_ref().map_or(0, |medium| medium.size());
        let within = held.saturating_sub(offset).min(buf.len() as u64) as usize;
        let (data, zeros) = buf.split_at_mut(within);
        zeros.fill(0);
        match &mut self.0 {
            Some(medium) if within > 0 => medium.read_at(offset, data),
            _ => Ok(()),
        }
    }

    fn write_at(&mut self, _offset: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            "the input disk is read-only",
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

    #[test]
    fn an_input_medium_reads_zeros_past_its_end_and_refuses_writes() {
        let mut empty = InputMedium(None);
        let mut read = [1; 512];
        empty.read_at(0, &mut read).unwrap();
        assert_eq!((empty.size(), read), (INPUT_DISK_BYTES, [0; 512]));
        let mut held = InputMedium(Some(Box::new(Sevens)));
        let mut read = [1; 1024];
        held.read_at(512, &mut read).unwrap();
        assert_eq!((read[511], read[512]), (7, 0));
        assert!(held.write_at(0, &[0; 512]).is_err());
    }
}
