//! virtio-blk (virtio 1.1 §5.2) over a [`Disk`]: one request queue, requests
//! served synchronously at the driver's notification.

use std::io::{self, Read, Write};

use super::{Reader, Writer};
use tracing::warn;

use super::{
    read_config_bytes, QueueIo, VirtioDevice, VIRTIO_F_RING_INDIRECT_DESC, VIRTIO_F_VERSION_1,
};
use crate::devices::persist::{InvalidState, Persist};
use crate::disk::Disk;

const DEVICE_ID: u32 = 2;
const QUEUE_SIZE: u16 = 256;
/// Data descriptors per request: all but the header's and the status's.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;

/// Feature bits (virtio 1.1 §5.2.3).
const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << 2;
const VIRTIO_BLK_F_RO: u64 = 1 << 5;
const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;

/// Request types (virtio 1.1 §5.2.6).
pub(crate) const VIRTIO_BLK_T_IN: u32 = 0;
pub(crate) const VIRTIO_BLK_T_OUT: u32 = 1;
pub(crate) const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub(crate) const VIRTIO_BLK_T_GET_ID: u32 = 8;

/// Status byte values.
pub(crate) const VIRTIO_BLK_S_OK: u8 = 0;
pub(crate) const VIRTIO_BLK_S_IOERR: u8 = 1;
pub(crate) const VIRTIO_BLK_S_UNSUPP: u8 = 2;

const SECTOR_SIZE: u64 = 512;
/// `type`, `reserved`, `sector`: all little-endian.
const HEADER_LEN: usize = 16;
/// GET_ID answers with at most 20 bytes, NUL-padded.
const ID_LEN: usize = 20;
const SERIAL: &[u8] = b"provm";
/// Data moves between guest and disk through a buffer of this size, so a
/// request's length never sizes an allocation.
pub(crate) const CHUNK: usize = 64 * 1024;

/// Why a request failed; all but `Unsupported` answer VIRTIO_BLK_S_IOERR.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("request header shorter than {HEADER_LEN} bytes")]
    ShortHeader,
    #[error("unsupported request type {0}")]
    Unsupported(u32),
    #[error("{0} data bytes where the request type allows none in that direction")]
    UnexpectedData(usize),
    #[error("data length {0} is not a whole number of sectors")]
    PartialSector(usize),
    #[error("sector {sector} + {len} bytes is beyond the disk's end")]
    OutOfRange { sector: u64, len: usize },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
}

impl RequestError {
    fn status(&self) -> u8 {
        match self {
            Self::Unsupported(_) => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        }
    }
}

/// A virtio block device.
pub struct VirtioBlock {
    disk: Box<dyn Disk>,
    read_only: bool,
}

impl VirtioBlock {
    /// A block device over `disk`; `read_only` offers VIRTIO_BLK_F_RO and
    /// fails writes.
    pub fn new(disk: Box<dyn Disk>, read_only: bool) -> Self {
        Self { disk, read_only }
    }

    /// Capacity in 512-byte sectors; a partial last sector is not exposed.
    fn capacity(&self) -> u64 {
        self.disk.size() / SECTOR_SIZE
    }

    /// Serves one request: header, data, then one status byte, the last
    /// device-writable byte (virtio 1.1 §5.2.6). Returns the used length.
    fn serve(&mut self, mut reader: Reader<'_>, mut writer: Writer<'_>) -> u32 {
        let Some(data_len) = writer.available_bytes().checked_sub(1) else {
            warn!("virtio-blk: request without room for a status byte, dropped");
            return 0;
        };
        let mut status_writer = match writer.split_at(data_len) {
            Ok(status_writer) => status_writer,
            Err(e) => {
                warn!("virtio-blk: cannot locate status byte: {e}");
                return 0;
            }
        };
        let status = match self.execute(&mut reader, &mut writer) {
            Ok(()) => VIRTIO_BLK_S_OK,
            Err(e) => {
                warn!("virtio-blk: request failed: {e}");
                e.status()
            }
        };
        if let Err(e) = status_writer.write_all(&[status]) {
            warn!("virtio-blk: cannot write status: {e}");
        }
        // Both lengths are bounded by the chain's, a u32 (virtio 1.1 §2.6.5).
        (writer.bytes_written() + status_writer.bytes_written()) as u32
    }

    fn execute(
        &mut self,
        reader: &mut Reader<'_>,
        data: &mut Writer<'_>,
    ) -> Result<(), RequestError> {
        let mut header = [0u8; HEADER_LEN];
        reader
            .read_exact(&mut header)
            .map_err(|_| RequestError::ShortHeader)?;
        let request_type = u32::from_le_bytes(header[0..4].try_into().unwrap());
        let sector = u64::from_le_bytes(header[8..16].try_into().unwrap());
        match request_type {
            VIRTIO_BLK_T_IN => {
                no_data(reader.available_bytes())?;
                let offset = self.checked_range(sector, data.available_bytes())?;
                self.read_into(offset, data)
            }
            VIRTIO_BLK_T_OUT => {
                no_data(data.available_bytes())?;
                if self.read_only {
                    return Err(RequestError::ReadOnly);
                }
                let offset = self.checked_range(sector, reader.available_bytes())?;
                self.write_from(offset, reader)
            }
            VIRTIO_BLK_T_FLUSH => {
                no_data(reader.available_bytes() + data.available_bytes())?;
                Ok(self.disk.flush()?)
            }
            VIRTIO_BLK_T_GET_ID => {
                let mut id = [0u8; ID_LEN];
                id[..SERIAL.len()].copy_from_slice(SERIAL);
                let len = data.available_bytes().min(ID_LEN);
                Ok(data.write_all(&id[..len])?)
            }
            other => Err(RequestError::Unsupported(other)),
        }
    }

    /// The byte offset of `sector`, if `len` bytes from there are whole
    /// sectors inside the disk.
    fn checked_range(&self, sector: u64, len: usize) -> Result<u64, RequestError> {
        if !(len as u64).is_multiple_of(SECTOR_SIZE) {
            return Err(RequestError::PartialSector(len));
        }
        let end = sector.checked_add(len as u64 / SECTOR_SIZE);
        match end {
            Some(end) if end <= self.capacity() => Ok(sector * SECTOR_SIZE),
            _ => Err(RequestError::OutOfRange { sector, len }),
        }
    }

    fn read_into(&mut self, mut offset: u64, data: &mut Writer<'_>) -> Result<(), RequestError> {
        let mut buf = vec![0u8; CHUNK.min(data.available_bytes())];
        while data.available_bytes() > 0 {
            let chunk = &mut buf[..CHUNK.min(data.available_bytes())];
            self.disk.read_at(offset, chunk)?;
            data.write_all(chunk)?;
            offset += chunk.len() as u64;
        }
        Ok(())
    }

    fn write_from(&mut self, mut offset: u64, data: &mut Reader<'_>) -> Result<(), RequestError> {
        let mut buf = vec![0u8; CHUNK.min(data.available_bytes())];
        while data.available_bytes() > 0 {
            let chunk = &mut buf[..CHUNK.min(data.available_bytes())];
            data.read_exact(chunk)?;
            self.disk.write_at(offset, chunk)?;
            offset += chunk.len() as u64;
        }
        Ok(())
    }
}

/// Checks that a request carries no data in a direction it has none.
fn no_data(len: usize) -> Result<(), RequestError> {
    match len {
        0 => Ok(()),
        len => Err(RequestError::UnexpectedData(len)),
    }
}

/// Requests complete at the notify that submits them: nothing is in flight
/// between exits, so the transport's state is the whole device's.
impl Persist for VirtioBlock {
    type State = ();

    fn save(&self) {}

    fn restore(&mut self, _: &()) -> Result<(), InvalidState> {
        Ok(())
    }
}

impl VirtioDevice for VirtioBlock {
    fn device_type(&self) -> u32 {
        DEVICE_ID
    }

    fn features(&self) -> u64 {
        let read_only = if self.read_only { VIRTIO_BLK_F_RO } else { 0 };
        VIRTIO_F_VERSION_1
            | VIRTIO_F_RING_INDIRECT_DESC
            | VIRTIO_BLK_F_SEG_MAX
            | VIRTIO_BLK_F_FLUSH
            | read_only
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    /// The header, SEG_MAX data segments and the status, as offered.
    fn max_chain_descriptors(&self) -> usize {
        SEG_MAX as usize + 2
    }

    /// `capacity`, `size_max` (0: not offered) and `seg_max` of
    /// `struct virtio_blk_config` (virtio 1.1 §5.2.4); the later fields
    /// depend on features not offered.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.capacity().to_le_bytes());
        config[12..].copy_from_slice(&SEG_MAX.to_le_bytes());
        read_config_bytes(&config, offset, data);
    }

    fn process_queue(&mut self, _index: usize, queue: &mut QueueIo<'_>) {
        while queue.serve_one(|reader, writer| self.serve(reader, writer)) {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use crate::memory::GuestMemory;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::bus::BusDevice;
    use crate::devices::virtio::mmio::{regs, MmioTransport};
    use crate::devices::virtio::testing::*;

    const SECTORS: u64 = 8;
    const HEADER: u64 = DATA;
    const BUFFER: u64 = DATA + 0x1000;
    const STATUS: u64 = DATA + 0x3000;

    #[derive(Default)]
    struct DiskState {
        bytes: Vec<u8>,
        flushes: usize,
    }

    /// An in-memory disk whose state the test keeps a handle on.
    struct MemDisk(Arc<Mutex<DiskState>>);

    impl Disk for MemDisk {
        fn size(&self) -> u64 {
            self.0.lock().unwrap().bytes.len() as u64
        }
        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let offset = offset as usize;
            buf.copy_from_slice(&self.0.lock().unwrap().bytes[offset..offset + buf.len()]);
            Ok(())
        }
        fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
            let offset = offset as usize;
            self.0.lock().unwrap().bytes[offset..offset + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.0.lock().unwrap().flushes += 1;
            Ok(())
        }
    }

    struct Fixture {
        mem: GuestMemory,
        disk: Arc<Mutex<DiskState>>,
        transport: MmioTransport<VirtioBlock>,
    }

    impl Fixture {
        fn new(read_only: bool) -> Self {
            let mem = guest_memory();
            let bytes = (0..SECTORS * SECTOR_SIZE)
                .map(|i| (i % 251) as u8)
                .collect();
            let disk = Arc::new(Mutex::new(DiskState { bytes, flushes: 0 }));
            let block = VirtioBlock::new(Box::new(MemDisk(disk.clone())), read_only);
            let (transport, _) = transport(block, &mem);
            Self {
                mem,
                disk,
                transport,
            }
        }

        /// Submits one request as a chain of `descs`, the header already at
        /// HEADER, and returns (used len, status byte at STATUS).
        fn submit(&mut self, descs: &[(u64, u32, u16)]) -> (u32, u8) {
            let queue = mock_queue(&self.mem, 0);
            initialize(&mut self.transport, &[&queue]);
            add_chain(&queue, 0, descs);
            write_reg(&mut self.transport, regs::QUEUE_NOTIFY, 0);
            let used = used(&queue);
            assert_eq!(used.len(), 1);
            (used[0].1, self.mem.read_obj(GuestAddress(STATUS)).unwrap())
        }

        fn write_header(&self, request_type: u32, sector: u64) {
            let mut header = [0u8; HEADER_LEN];
            header[..4].copy_from_slice(&request_type.to_le_bytes());
            header[8..].copy_from_slice(&sector.to_le_bytes());
            self.mem.write_slice(&header, GuestAddress(HEADER)).unwrap();
            self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        }

        fn read_buffer(&self, len: usize) -> Vec<u8> {
            let mut data = vec![0; len];
            self.mem
                .read_slice(&mut data, GuestAddress(BUFFER))
                .unwrap();
            data
        }

        /// A request of `request_type` with `len` data bytes at BUFFER,
        /// device-writable if `flags` says so.
        fn request(&mut self, request_type: u32, sector: u64, len: u32, flags: u16) -> (u32, u8) {
            self.write_header(request_type, sector);
            self.submit(&[
                (HEADER, HEADER_LEN as u32, 0),
                (BUFFER, len, flags),
                (STATUS, 1, DESC_F_WRITE),
            ])
        }
    }

    #[test]
    fn config_and_features() {
        let mut f = Fixture::new(false);
        let t = &mut f.transport;
        assert_eq!(read_reg(t, regs::DEVICE_ID), 2);
        assert_eq!(read_reg(t, regs::CONFIG), SECTORS as u32);
        assert_eq!(read_reg(t, regs::CONFIG + 4), 0);
        assert_eq!(read_reg(t, regs::CONFIG + 12), 254);
        assert_eq!(
            read_reg(t, regs::DEVICE_FEATURES),
            1 << 28 | 1 << 9 | 1 << 2
        );
        let mut ro = Fixture::new(true);
        let features = read_reg(&mut ro.transport, regs::DEVICE_FEATURES);
        assert_eq!(features, 1 << 28 | 1 << 9 | 1 << 5 | 1 << 2);
    }

    #[test]
    fn write_then_read_round_trip() {
        let mut f = Fixture::new(false);
        let pattern: Vec<u8> = (0..1024).map(|i| (i * 7) as u8).collect();
        f.mem.write_slice(&pattern, GuestAddress(BUFFER)).unwrap();
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 2, 1024, 0),
            (1, VIRTIO_BLK_S_OK)
        );
        assert_eq!(f.disk.lock().unwrap().bytes[1024..2048], pattern[..]);

        f.mem.write_slice(&[0; 1024], GuestAddress(BUFFER)).unwrap();
        let (len, status) = f.request(VIRTIO_BLK_T_IN, 2, 1024, DESC_F_WRITE);
        assert_eq!((len, status), (1025, VIRTIO_BLK_S_OK));
        assert_eq!(f.read_buffer(1024), pattern);
    }

    #[test]
    fn read_split_across_descriptors() {
        let mut f = Fixture::new(false);
        f.write_header(VIRTIO_BLK_T_IN, 7);
        let (len, status) = f.submit(&[
            (HEADER, 10, 0),
            (HEADER + 10, 6, 0),
            (BUFFER, 100, DESC_F_WRITE),
            (BUFFER + 100, 412, DESC_F_WRITE),
            (STATUS, 1, DESC_F_WRITE),
        ]);
        assert_eq!((len, status), (513, VIRTIO_BLK_S_OK));
        assert_eq!(f.read_buffer(512), f.disk.lock().unwrap().bytes[3584..]);
    }

    #[test]
    fn read_through_an_indirect_table() {
        let mut f = Fixture::new(false);
        f.write_header(VIRTIO_BLK_T_IN, 1);
        let table = [
            (HEADER, HEADER_LEN as u32, 0),
            (BUFFER, 512, DESC_F_WRITE),
            (STATUS, 1, DESC_F_WRITE),
        ];
        let indirect = indirect_table(&f.mem, DATA + 0x4000, &table);
        assert_eq!(f.submit(&[indirect]), (513, VIRTIO_BLK_S_OK));
        assert_eq!(f.read_buffer(512), f.disk.lock().unwrap().bytes[512..1024]);
    }

    #[test]
    fn sector_past_end_is_ioerr() {
        let mut f = Fixture::new(false);
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, SECTORS - 1, 1024, DESC_F_WRITE),
            (1, VIRTIO_BLK_S_IOERR)
        );
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, u64::MAX, 512, 0),
            (1, VIRTIO_BLK_S_IOERR)
        );
    }

    #[test]
    fn short_status_descriptor_is_ioerr() {
        // The status byte is the last writable byte: here the buffer's last,
        // which leaves a partial sector to read.
        let mut f = Fixture::new(false);
        f.write_header(VIRTIO_BLK_T_IN, 0);
        let (len, status) = f.submit(&[
            (HEADER, HEADER_LEN as u32, 0),
            (BUFFER, 512, DESC_F_WRITE),
            (STATUS, 0, DESC_F_WRITE),
        ]);
        assert_eq!((len, status), (1, 0xff));
        assert_eq!(f.read_buffer(512)[511], VIRTIO_BLK_S_IOERR);
    }

    #[test]
    fn data_in_the_wrong_direction_is_ioerr() {
        let mut f = Fixture::new(false);
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, 0, 512, 0),
            (1, VIRTIO_BLK_S_IOERR)
        );
        let before = f.disk.lock().unwrap().bytes.clone();
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 0, 512, DESC_F_WRITE),
            (1, VIRTIO_BLK_S_IOERR)
        );
        assert_eq!(f.disk.lock().unwrap().bytes, before);
    }

    #[test]
    fn partial_sector_and_short_header_are_ioerr() {
        let mut f = Fixture::new(false);
        assert_eq!(
            f.request(VIRTIO_BLK_T_IN, 0, 100, DESC_F_WRITE),
            (1, VIRTIO_BLK_S_IOERR)
        );
        f.write_header(VIRTIO_BLK_T_IN, 0);
        let request = [(HEADER, 8, 0), (STATUS, 1, DESC_F_WRITE)];
        assert_eq!(f.submit(&request), (1, VIRTIO_BLK_S_IOERR));
    }

    #[test]
    fn unusable_chains_are_returned_unwritten() {
        let mut f = Fixture::new(false);
        f.write_header(VIRTIO_BLK_T_IN, 0);
        // Nowhere to put a status byte.
        assert_eq!(f.submit(&[(HEADER, HEADER_LEN as u32, 0)]), (0, 0xff));
        // A buffer beyond guest memory.
        let request = [
            (HEADER, 16, 0),
            (1 << 40, 512, DESC_F_WRITE),
            (STATUS, 1, DESC_F_WRITE),
        ];
        assert_eq!(f.submit(&request), (0, 0xff));
    }

    #[test]
    fn flush() {
        let mut f = Fixture::new(false);
        f.write_header(VIRTIO_BLK_T_FLUSH, 0);
        let request = [(HEADER, 16, 0), (STATUS, 1, DESC_F_WRITE)];
        assert_eq!(f.submit(&request), (1, VIRTIO_BLK_S_OK));
        assert_eq!(f.disk.lock().unwrap().flushes, 1);
    }

    #[test]
    fn get_id() {
        let mut f = Fixture::new(false);
        let (len, status) = f.request(VIRTIO_BLK_T_GET_ID, 0, ID_LEN as u32, DESC_F_WRITE);
        assert_eq!((len, status), (ID_LEN as u32 + 1, VIRTIO_BLK_S_OK));
        assert_eq!(
            f.read_buffer(ID_LEN),
            b"provm\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"
        );
    }

    #[test]
    fn unknown_request_is_unsupp() {
        let mut f = Fixture::new(false);
        f.write_header(11, 0);
        let request = [(HEADER, 16, 0), (STATUS, 1, DESC_F_WRITE)];
        assert_eq!(f.submit(&request), (1, VIRTIO_BLK_S_UNSUPP));
    }

    #[test]
    fn read_only_disk_refuses_writes() {
        let mut f = Fixture::new(true);
        let before = f.disk.lock().unwrap().bytes.clone();
        assert_eq!(
            f.request(VIRTIO_BLK_T_OUT, 0, 512, 0),
            (1, VIRTIO_BLK_S_IOERR)
        );
        assert_eq!(f.disk.lock().unwrap().bytes, before);
        let (len, status) = f.request(VIRTIO_BLK_T_IN, 0, 512, DESC_F_WRITE);
        assert_eq!((len, status), (513, VIRTIO_BLK_S_OK));
    }

    #[test]
    fn serves_every_available_request_at_one_notify() {
        let mut f = Fixture::new(false);
        let queue = mock_queue(&f.mem, 0);
        initialize(&mut f.transport, &[&queue]);
        f.write_header(VIRTIO_BLK_T_FLUSH, 0);
        for first in [0, 2, 4] {
            add_chain(&queue, first, &[(HEADER, 16, 0), (STATUS, 1, DESC_F_WRITE)]);
        }
        f.transport.write(regs::QUEUE_NOTIFY, &0u32.to_le_bytes());
        assert_eq!(used(&queue), [(0, 1), (2, 1), (4, 1)]);
        assert_eq!(f.disk.lock().unwrap().flushes, 3);
    }

    #[test]
    fn request_over_seg_max_is_returned_unwritten() {
        let mut f = Fixture::new(false);
        f.write_header(VIRTIO_BLK_T_IN, 0);
        let request = |segments: u32| {
            let data = (0..segments).map(|_| (BUFFER, 512, DESC_F_WRITE));
            std::iter::once((HEADER, HEADER_LEN as u32, 0))
                .chain(data)
                .chain(std::iter::once((STATUS, 1, DESC_F_WRITE)))
                .collect::<Vec<_>>()
        };
        // SEG_MAX sectors, all read into one buffer: allowed.
        f.disk
            .lock()
            .unwrap()
            .bytes
            .resize(SEG_MAX as usize * 512, 0);
        let table = indirect_table(&f.mem, DATA + 0x4000, &request(SEG_MAX));
        assert_eq!(f.submit(&[table]), (SEG_MAX * 512 + 1, VIRTIO_BLK_S_OK));
        f.write_header(VIRTIO_BLK_T_IN, 0);
        let table = indirect_table(&f.mem, DATA + 0x8000, &request(SEG_MAX + 1));
        assert_eq!(f.submit(&[table]), (0, 0xff));
    }
}
