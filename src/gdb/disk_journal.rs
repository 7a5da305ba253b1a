//! The replayed guest's disk, able to go back in time: every write keeps
//! the bytes it replaced, so a time-travel snapshot needs only a mark in
//! the journal, and going back to it undoes the writes made after it.
//!
//! A replay writes what the recording wrote, in the same order, so going
//! forward again from a mark rebuilds the same journal: marks taken later
//! stay valid after a rewind. The journal holds the old bytes of every
//! write the replay has made (as much as the guest wrote).

use std::io;
use std::sync::{Arc, Mutex};

use provm_vmm::disk::Disk;

struct Journal {
    disk: Box<dyn Disk>,
    /// For each write in order: where, and the bytes it overwrote.
    undo: Vec<(u64, Vec<u8>)>,
}

/// A point of the disk's history (`DiskJournal::mark`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark(usize);

#[derive(Clone)]
pub struct DiskJournal(Arc<Mutex<Journal>>);

impl DiskJournal {
    pub fn new(disk: Box<dyn Disk>) -> Self {
        DiskJournal(Arc::new(Mutex::new(Journal {
            disk,
            undo: Vec::new(),
        })))
    }

    /// The disk to give a VM: it writes through the journal.
    pub fn disk(&self) -> Box<dyn Disk> {
        Box::new(self.clone())
    }

    /// The disk's history up to now.
    pub fn mark(&self) -> Mark {
        Mark(self.0.lock().unwrap().undo.len())
    }

    /// Undoes every write made after `mark`, newest first.
    pub fn rewind(&self, mark: Mark) -> io::Result<()> {
        let mut journal = self.0.lock().unwrap();
        while journal.undo.len() > mark.0 {
            let (offset, old) = journal.undo.pop().expect("longer than the mark");
            journal.disk.write_at(offset, &old)?;
        }
        Ok(())
    }
}

impl Disk for DiskJournal {
    fn size(&self) -> u64 {
        self.0.lock().unwrap().disk.size()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.lock().unwrap().disk.read_at(offset, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut journal = self.0.lock().unwrap();
        let mut old = vec![0; buf.len()];
        journal.disk.read_at(offset, &mut old)?;
        journal.disk.write_at(offset, buf)?;
        journal.undo.push((offset, old));
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().unwrap().disk.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk in memory.
    struct Ram(Vec<u8>);

    impl Disk for Ram {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let at = offset as usize;
            buf.copy_from_slice(&self.0[at..at + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
            let at = offset as usize;
            self.0[at..at + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn contents(disk: &mut dyn Disk) -> Vec<u8> {
        let mut bytes = vec![0; disk.size() as usize];
        disk.read_at(0, &mut bytes).unwrap();
        bytes
    }

    #[test]
    fn rewinding_undoes_the_writes_after_the_mark_and_keeps_the_ones_before() {
        let journal = DiskJournal::new(Box::new(Ram(vec![0; 8])));
        let mut disk = journal.disk();
        disk.write_at(0, &[1, 1]).unwrap();
        let mark = journal.mark();
        disk.write_at(1, &[2, 2]).unwrap();
        disk.write_at(0, &[3]).unwrap();
        assert_eq!(contents(disk.as_mut()), [3, 2, 2, 0, 0, 0, 0, 0]);
        journal.rewind(mark).unwrap();
        assert_eq!(contents(disk.as_mut()), [1, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(journal.mark(), mark);
    }

    #[test]
    fn the_same_writes_after_a_rewind_rebuild_the_same_journal() {
        let journal = DiskJournal::new(Box::new(Ram(vec![0; 4])));
        let mut disk = journal.disk();
        let start = journal.mark();
        disk.write_at(0, &[7]).unwrap();
        let later = journal.mark();
        disk.write_at(0, &[9]).unwrap();
        journal.rewind(start).unwrap();
        disk.write_at(0, &[7]).unwrap();
        assert_eq!(journal.mark(), later);
        disk.write_at(0, &[9]).unwrap();
        journal.rewind(later).unwrap();
        assert_eq!(contents(disk.as_mut()), [7, 0, 0, 0]);
    }
}
