//! virtio over the MMIO transport: the block device, the agent's console
//! and, with `--net`, the network card.
//!
//! The transport ([`mmio::MmioTransport`]) owns the registers, the queues and
//! the interrupt; a device ([`VirtioDevice`]) only turns descriptor chains into
//! work. All of it runs on the vCPU thread, at the exit that asked for it.

use crate::memory::GuestMemory;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::{AtomicBitmap, BS};

use super::persist::Persist;

pub mod block;
pub mod console;
pub mod mmio;
pub mod net;

/// The device conforms to virtio 1.x (virtio 1.1 §6); required by the
/// version 2 MMIO transport.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// The driver may put a table of descriptors behind one descriptor (virtio
/// 1.1 §2.6.5.3); `virtio_queue` walks such chains transparently.
pub const VIRTIO_F_RING_INDIRECT_DESC: u64 = 1 << 28;

/// A virtio device behind a transport. Its [`Persist`] state is what a
/// snapshot must carry beyond the transport's.
pub trait VirtioDevice: Persist + Send {
    /// Device ID (virtio 1.1 §5), e.g. 2 for block, 3 for console.
    fn device_type(&self) -> u32;

    /// Feature bits offered to the driver, including [`VIRTIO_F_VERSION_1`].
    fn features(&self) -> u64;

    /// Maximum size of each queue, one entry per queue; powers of two.
    fn queue_max_sizes(&self) -> &[u16];

    /// The most descriptors a chain may have; a longer one is returned
    /// unused. By default the most an indirect table can hold (a direct
    /// chain has at most the queue's size).
    fn max_chain_descriptors(&self) -> usize {
        usize::from(u16::MAX)
    }

    /// Reads device configuration space at `offset`; bytes past its end read 0.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&[], offset, data);
    }

    /// Writes device configuration space. No device here has writable fields.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        tracing::warn!(
            offset,
            len = data.len(),
            "virtio: ignoring config space write"
        );
    }

    /// The driver has set DRIVER_OK: `queues` are live from now on.
    fn activate(&mut self, _queues: &mut DeviceQueues<'_>) {}

    /// The driver notified queue `index` (always one of the device's queues,
    /// made ready by the driver, with the device live).
    fn process_queue(&mut self, index: usize, queue: &mut QueueIo<'_>);
}

/// Copies the part of `config` at `offset` into `data`, zero-filling the rest.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Some(tail) = usize::try_from(offset).ok().and_then(|o| config.get(o..)) else {
        return;
    };
    let len = tail.len().min(data.len());
    data[..len].copy_from_slice(&tail[..len]);
}

/// A device's queues and the guest memory their buffers live in, lent to the
/// device for one piece of work. Empty while the device is not live.
pub struct DeviceQueues<'a> {
    mem: &'a GuestMemory,
    queues: &'a mut [Queue],
    max_chain_descriptors: usize,
    /// Whether any chain went back to the driver (the transport then
    /// raises the used-buffer interrupt).
    used: bool,
}

impl<'a> DeviceQueues<'a> {
    pub(crate) fn new(
        mem: &'a GuestMemory,
        queues: &'a mut [Queue],
        max_chain_descriptors: usize,
    ) -> Self {
        Self {
            mem,
            queues,
            max_chain_descriptors,
            used: false,
        }
    }

    /// Queue `index`, if the device is live and the driver made it ready.
    pub fn get(&mut self, index: usize) -> Option<QueueIo<'_>> {
        let queue = self.queues.get_mut(index).filter(|q| q.ready())?;
        Some(QueueIo {
            queue,
            mem: self.mem,
            max_chain_descriptors: self.max_chain_descriptors,
            used: &mut self.used,
        })
    }

    pub(crate) fn used(&self) -> bool {
        self.used
    }
}

/// A chain's device-readable bytes in guest RAM.
pub type Reader<'a> = virtio_queue::Reader<'a, BS<'a, AtomicBitmap>>;
/// A chain's device-writable bytes in guest RAM, whose bitmap marks what
/// a device writes (`memory::GuestMemory`).
pub type Writer<'a> = virtio_queue::Writer<'a, BS<'a, AtomicBitmap>>;

/// One live queue: pops the chains the driver made available and returns
/// them on the used ring (virtio 1.1 §2.6).
pub struct QueueIo<'a> {
    queue: &'a mut Queue,
    mem: &'a GuestMemory,
    max_chain_descriptors: usize,
    used: &'a mut bool,
}

impl QueueIo<'_> {
    /// Whether the driver has made a chain available that `serve_one`
    /// would take.
    pub fn has_available(&self) -> bool {
        self.queue
            .avail_idx(self.mem, std::sync::atomic::Ordering::Acquire)
            .is_ok_and(|idx| idx.0 != self.queue.next_avail())
    }

    /// Serves the next available chain: `serve` gets its device-readable and
    /// device-writable bytes (virtio 1.1 §2.6.4: devices must not depend on
    /// how the driver split them into descriptors) and returns how many bytes
    /// it wrote, the used length. False when the ring has no chain left.
    /// A chain `serve` cannot take (outside guest memory, too many
    /// descriptors) goes back with used length 0.
    pub fn serve_one(&mut self, serve: impl FnOnce(Reader<'_>, Writer<'_>) -> u32) -> bool {
        let Some(chain) = self.queue.pop_descriptor_chain(self.mem) else {
            return false;
        };
        let head = chain.head_index();
        let descriptors = chain.clone().count();
        let len = if descriptors > self.max_chain_descriptors {
            let max = self.max_chain_descriptors;
            tracing::warn!(head, descriptors, max, "virtio: chain too long");
            0
        } else if let (Ok(reader), Ok(writer)) =
            (chain.clone().reader(self.mem), chain.writer(self.mem))
        {
            serve(reader, writer)
        } else {
            tracing::warn!(head, "virtio: descriptor chain outside guest memory");
            0
        };
        match self.queue.add_used(self.mem, head, len) {
            Ok(()) => *self.used = true,
            Err(e) => tracing::warn!(head, "virtio: cannot return chain: {e}"),
        }
        true
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A driver's side of the transport, for the devices' tests.

    use std::sync::{Arc, Mutex};

    use crate::memory::GuestMemory;
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    use super::mmio::{self, MmioTransport};
    use super::VirtioDevice;
    use crate::bus::BusDevice;
    use crate::devices::IrqLine;

    pub const DESC_F_NEXT: u16 = 1;
    pub const DESC_F_WRITE: u16 = 2;
    pub const DESC_F_INDIRECT: u16 = 4;
    pub const QUEUE_LEN: u16 = 16;
    /// Buffers live above the queues.
    pub const DATA: u64 = 0x10_0000;

    /// An interrupt line recording every level it was driven to.
    #[derive(Default)]
    pub struct RecordingIrq(Mutex<Vec<bool>>);

    impl RecordingIrq {
        pub fn levels(&self) -> Vec<bool> {
            self.0.lock().unwrap().clone()
        }
        pub fn is_high(&self) -> bool {
            self.levels().last() == Some(&true)
        }
    }

    impl IrqLine for RecordingIrq {
        fn set_level(&self, high: bool) {
            self.0.lock().unwrap().push(high);
        }
    }

    pub fn guest_memory() -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap()
    }

    pub fn read_reg(dev: &mut impl BusDevice, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        dev.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    pub fn write_reg(dev: &mut impl BusDevice, offset: u64, value: u32) {
        dev.write(offset, &value.to_le_bytes());
    }

    /// The driver-side rings of queue `index`, each queue in its own 64 KiB.
    pub fn mock_queue(mem: &GuestMemory, index: u16) -> MockSplitQueue<'_, GuestMemory> {
        MockSplitQueue::create(
            mem,
            GuestAddress(0x1_0000 * (u64::from(index) + 1)),
            QUEUE_LEN,
        )
    }

    pub fn transport<D: VirtioDevice>(
        device: D,
        mem: &GuestMemory,
    ) -> (MmioTransport<D>, Arc<RecordingIrq>) {
        let irq = Arc::new(RecordingIrq::default());
        let transport = MmioTransport::new(device, mem.clone(), irq.clone()).unwrap();
        (transport, irq)
    }

    /// Runs the driver initialisation of virtio 1.1 §3.1.1, accepting every
    /// offered feature and setting up `queues` as queues 0, 1, ...
    pub fn initialize<D: VirtioDevice>(
        t: &mut MmioTransport<D>,
        queues: &[&MockSplitQueue<'_, GuestMemory>],
    ) {
        let rings: Vec<Rings> = queues
            .iter()
            .map(|q| Rings {
                size: QUEUE_LEN,
                desc_table: q.desc_table_addr().0,
                avail: q.avail_addr().0,
                used: q.used_addr().0,
            })
            .collect();
        initialize_rings(t, &rings);
        assert_eq!(
            read_reg(t, mmio::regs::STATUS) & mmio::regs::DEVICE_NEEDS_RESET,
            0
        );
    }

    /// Where a driver put one queue's rings, and its size.
    pub struct Rings {
        pub size: u16,
        pub desc_table: u64,
        pub avail: u64,
        pub used: u64,
    }

    /// `initialize` with rings anywhere, even outside guest memory.
    pub fn initialize_rings<D: VirtioDevice>(t: &mut MmioTransport<D>, queues: &[Rings]) {
        use mmio::regs::*;
        write_reg(t, STATUS, 0);
        write_reg(t, STATUS, ACKNOWLEDGE);
        write_reg(t, STATUS, ACKNOWLEDGE | DRIVER);
        for page in 0..2 {
            write_reg(t, DEVICE_FEATURES_SEL, page);
            let features = read_reg(t, DEVICE_FEATURES);
            write_reg(t, DRIVER_FEATURES_SEL, page);
            write_reg(t, DRIVER_FEATURES, features);
        }
        write_reg(t, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_ne!(read_reg(t, STATUS) & FEATURES_OK, 0);
        for (index, queue) in queues.iter().enumerate() {
            write_reg(t, QUEUE_SEL, index as u32);
            write_reg(t, QUEUE_NUM, u32::from(queue.size));
            for (low, addr) in [
                (QUEUE_DESC_LOW, queue.desc_table),
                (QUEUE_DRIVER_LOW, queue.avail),
                (QUEUE_DEVICE_LOW, queue.used),
            ] {
                write_reg(t, low, addr as u32);
                write_reg(t, low + 4, (addr >> 32) as u32);
            }
            write_reg(t, QUEUE_READY, 1);
        }
        write_reg(t, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
    }

    /// `descs` (addr, len, flags) linked into one chain whose first
    /// descriptor will sit at index `first` of its table.
    fn chain(first: u16, descs: &[(u64, u32, u16)]) -> Vec<Descriptor> {
        let last = descs.len() - 1;
        descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                if i == last {
                    Descriptor::new(addr, len, flags, 0)
                } else {
                    Descriptor::new(addr, len, flags | DESC_F_NEXT, first + i as u16 + 1)
                }
            })
            .collect()
    }

    /// Makes `descs` available as one chain, starting at descriptor `first`.
    pub fn add_chain(
        queue: &MockSplitQueue<'_, GuestMemory>,
        first: u16,
        descs: &[(u64, u32, u16)],
    ) {
        let raw: Vec<RawDescriptor> = chain(first, descs).into_iter().map(Into::into).collect();
        queue.add_desc_chains(&raw, first).unwrap();
    }

    /// Writes `descs` as a chain in an indirect table at `addr` and returns
    /// the descriptor that refers to it (virtio 1.1 §2.6.5.3).
    pub fn indirect_table(
        mem: &GuestMemory,
        addr: u64,
        descs: &[(u64, u32, u16)],
    ) -> (u64, u32, u16) {
        for (i, desc) in chain(0, descs).into_iter().enumerate() {
            mem.write_obj(desc, GuestAddress(addr + 16 * i as u64))
                .unwrap();
        }
        (addr, 16 * descs.len() as u32, DESC_F_INDIRECT)
    }

    /// The used ring entries, as (head, len).
    pub fn used(queue: &MockSplitQueue<'_, GuestMemory>) -> Vec<(u32, u32)> {
        let count = queue.used().idx().load();
        (0..count)
            .map(|i| {
                let elem = queue.used().ring().ref_at(usize::from(i)).unwrap().load();
                (elem.id(), elem.len())
            })
            .collect()
    }
}
