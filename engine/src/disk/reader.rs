//! A [`Disk`] as a `Read + Seek` stream, for the partition table crates.

use std::io::{self, Read, Seek, SeekFrom};

use provm_vmm::disk::Disk;

/// Reads a [`Disk`] from a cursor; reads stop at the disk's end.
pub struct DiskReader<'a> {
    disk: &'a mut dyn Disk,
    position: u64,
}

impl<'a> DiskReader<'a> {
    pub fn new(disk: &'a mut dyn Disk) -> DiskReader<'a> {
        DiskReader { disk, position: 0 }
    }

    pub fn size(&self) -> u64 {
        self.disk.size()
    }
}

impl Read for DiskReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.disk.size().saturating_sub(self.position);
        let len = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.disk.read_at(self.position, &mut buf[..len])?;
        self.position += len as u64;
        Ok(len)
    }
}

impl Seek for DiskReader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let position = match to {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::End(delta) => self.disk.size().checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        self.position = position.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek before the disk's start")
        })?;
        Ok(self.position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes(Vec<u8>);

    impl Disk for Bytes {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }

        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            buf.copy_from_slice(&self.0[offset as usize..][..buf.len()]);
            Ok(())
        }

        fn write_at(&mut self, _: u64, _: &[u8]) -> io::Result<()> {
            unreachable!("the reader only reads")
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn reads_and_seeks_like_a_file() {
        let mut disk = Bytes((0..=9).collect());
        let mut reader = DiskReader::new(&mut disk);
        let mut buf = [0; 4];
        assert_eq!(reader.seek(SeekFrom::End(-3)).unwrap(), 7);
        assert_eq!(reader.read(&mut buf).unwrap(), 3);
        assert_eq!(buf[..3], [7, 8, 9]);
        assert_eq!(reader.read(&mut buf).unwrap(), 0);
        reader.seek(SeekFrom::Start(2)).unwrap();
        reader.seek(SeekFrom::Current(1)).unwrap();
        reader.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [3, 4, 5, 6]);
        assert!(reader.seek(SeekFrom::Current(-8)).is_err());
    }
}
