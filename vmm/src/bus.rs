//! Port-I/O and MMIO buses: address ranges mapped to devices.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A device reachable through a range of port or memory addresses.
/// Offsets are relative to the start of the range the device was added at.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("device range {base:#x}+{len:#x} overlaps another device")]
    Overlap { base: u64, len: u64 },
    #[error("device range at {0:#x} is empty")]
    Empty(u64),
}

/// Maps non-overlapping address ranges to devices.
#[derive(Default)]
pub struct Bus {
    /// Keyed by the range's first address; value is (length, device).
    ranges: BTreeMap<u64, (u64, SharedDevice)>,
}

impl Bus {
    pub fn insert(&mut self, base: u64, len: u64, device: SharedDevice) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::Empty(base));
        }
        let end = base
            .checked_add(len)
            .ok_or(BusError::Overlap { base, len })?;
        let before = self.ranges.range(..end).next_back();
        if let Some((&other_base, &(other_len, _))) = before {
            if other_base + other_len > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        self.ranges.insert(base, (len, device));
        Ok(())
    }

    /// The device covering `address` and the offset of `address` inside it.
    pub fn resolve(&self, address: u64) -> Option<(&SharedDevice, u64)> {
        let (&base, (len, device)) = self.ranges.range(..=address).next_back()?;
        (address - base < *len).then_some((device, address - base))
    }

    /// Reads from the device at `address` in one access; false when no
    /// device is there.
    pub fn read(&self, address: u64, data: &mut [u8]) -> bool {
        // An element of at least one byte: there are no empty chunks.
        self.read_elements(address, data.len().max(1), data)
    }

    /// Writes to the device at `address` in one access; false when no
    /// device is there.
    pub fn write(&self, address: u64, data: &[u8]) -> bool {
        self.write_elements(address, data.len().max(1), data)
    }

    /// Reads `data` as accesses of `size` bytes each at `address`, one
    /// after the other, as a string instruction (`rep ins`) makes them;
    /// false when no device is there.
    pub fn read_elements(&self, address: u64, size: usize, data: &mut [u8]) -> bool {
        let Some((device, offset)) = self.resolve(address) else {
            return false;
        };
        let mut device = device.lock().unwrap();
        data.chunks_mut(size)
            .for_each(|element| device.read(offset, element));
        true
    }

    /// Writes `data` as accesses of `size` bytes each at `address`, one
    /// after the other (`rep outs`); false when no device is there.
    pub fn write_elements(&self, address: u64, size: usize, data: &[u8]) -> bool {
        let Some((device, offset)) = self.resolve(address) else {
            return false;
        };
        let mut device = device.lock().unwrap();
        data.chunks(size)
            .for_each(|element| device.write(offset, element));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remembers the last offset written and answers reads with it.
    #[derive(Default)]
    struct Echo(u64);

    impl BusDevice for Echo {
        fn read(&mut self, _offset: u64, data: &mut [u8]) {
            data.fill(self.0 as u8);
        }
        fn write(&mut self, offset: u64, _data: &[u8]) {
            self.0 = offset;
        }
    }

    fn echo() -> SharedDevice {
        Arc::new(Mutex::new(Echo::default()))
    }

    #[test]
    fn routes_by_range_with_relative_offsets() {
        let mut bus = Bus::default();
        bus.insert(0x40, 4, echo()).unwrap();
        bus.insert(0x3f8, 8, echo()).unwrap();
        assert!(bus.write(0x3fa, &[0]));
        let mut data = [0u8];
        assert!(bus.read(0x3f8, &mut data));
        assert_eq!(data, [2]);
        assert!(!bus.read(0x44, &mut data));
        assert!(!bus.write(0x3f7, &[0]));
    }

    #[test]
    fn rejects_overlaps_and_empty_ranges() {
        let mut bus = Bus::default();
        bus.insert(0x40, 4, echo()).unwrap();
        assert_eq!(
            bus.insert(0x43, 1, echo()),
            Err(BusError::Overlap { base: 0x43, len: 1 })
        );
        assert_eq!(
            bus.insert(0x3c, 5, echo()),
            Err(BusError::Overlap { base: 0x3c, len: 5 })
        );
        assert_eq!(bus.insert(0x50, 0, echo()), Err(BusError::Empty(0x50)));
        bus.insert(0x44, 1, echo()).unwrap();
        bus.insert(0x3c, 4, echo()).unwrap();
    }

    /// Counts accesses, answering each read with the count so far and
    /// remembering every write.
    #[derive(Default)]
    struct Counter {
        reads: u8,
        writes: Vec<Vec<u8>>,
    }

    impl BusDevice for Counter {
        fn read(&mut self, _offset: u64, data: &mut [u8]) {
            self.reads += 1;
            data.fill(self.reads);
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.writes.push(data.to_vec());
        }
    }

    #[test]
    fn string_accesses_reach_the_device_one_element_at_a_time() {
        let counter = Arc::new(Mutex::new(Counter::default()));
        let mut bus = Bus::default();
        bus.insert(0x1f0, 8, counter.clone()).unwrap();
        let mut data = [0u8; 6];
        assert!(bus.read_elements(0x1f0, 2, &mut data));
        assert_eq!(data, [1, 1, 2, 2, 3, 3]);
        assert!(bus.write_elements(0x1f0, 4, &[1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(counter.lock().unwrap().writes, [[1, 2, 3, 4], [5, 6, 7, 8]]);
        assert!(!bus.read_elements(0x1f8, 1, &mut data));
        assert!(!bus.write_elements(0x1e0, 1, &data));
    }
}
