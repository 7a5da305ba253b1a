//! The virtio-mmio transport, version 2 (virtio 1.1 §4.2.2): one 4 KiB page
//! of registers per device, device configuration space from 0x100.
//!
//! Everything the guest writes is checked: a driver that breaks the protocol
//! gets its write ignored or the device marked DEVICE_NEEDS_RESET, never a
//! panic in the VMM.

use serde::{Deserialize, Serialize};
use tracing::warn;
use virtio_queue::{Error as QueueError, Queue, QueueState, QueueT};
use vm_memory::{GuestAddress, GuestMemory, Permissions};

use super::{DeviceQueues, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::bus::BusDevice;
use crate::devices::persist::{require, InvalidState, Persist};
use crate::devices::SharedIrqLine;

/// Register offsets and the device status bits (virtio 1.1 §2.1, §4.2.2).
pub mod regs {
    pub const MAGIC_VALUE: u64 = 0x000;
    pub const VERSION: u64 = 0x004;
    pub const DEVICE_ID: u64 = 0x008;
    pub const VENDOR_ID: u64 = 0x00c;
    pub const DEVICE_FEATURES: u64 = 0x010;
    pub const DEVICE_FEATURES_SEL: u64 = 0x014;
    pub const DRIVER_FEATURES: u64 = 0x020;
    pub const DRIVER_FEATURES_SEL: u64 = 0x024;
    pub const QUEUE_SEL: u64 = 0x030;
    pub const QUEUE_NUM_MAX: u64 = 0x034;
    pub const QUEUE_NUM: u64 = 0x038;
    pub const QUEUE_READY: u64 = 0x044;
    pub const QUEUE_NOTIFY: u64 = 0x050;
    pub const INTERRUPT_STATUS: u64 = 0x060;
    pub const INTERRUPT_ACK: u64 = 0x064;
    pub const STATUS: u64 = 0x070;
    pub const QUEUE_DESC_LOW: u64 = 0x080;
    pub const QUEUE_DESC_HIGH: u64 = 0x084;
    pub const QUEUE_DRIVER_LOW: u64 = 0x090;
    pub const QUEUE_DRIVER_HIGH: u64 = 0x094;
    pub const QUEUE_DEVICE_LOW: u64 = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
    pub const CONFIG_GENERATION: u64 = 0x0fc;
    pub const CONFIG: u64 = 0x100;

    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const DEVICE_NEEDS_RESET: u32 = 64;
    pub const FAILED: u32 = 128;

    /// InterruptStatus bits.
    pub const INT_USED_RING: u32 = 1;
    pub const INT_CONFIG: u32 = 2;
}

use regs::*;

/// How a refused saved state names the device.
const STATE_NAME: &str = "virtio-mmio";
/// "virt", little-endian.
const MAGIC: u32 = 0x7472_6976;
const MMIO_VERSION: u32 = 2;
/// "prvm", little-endian.
const VENDOR: u32 = u32::from_le_bytes(*b"prvm");

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("virtio queue {index}: invalid maximum size {size}")]
    QueueMaxSize { index: usize, size: u16 },
}

/// A virtio device on the MMIO bus: the transport's registers and state, the
/// device's queues, and its interrupt line.
pub struct MmioTransport<D: VirtioDevice> {
    device: D,
    mem: crate::memory::GuestMemory,
    irq: SharedIrqLine,
    queues: Vec<Queue>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    interrupt_status: u32,
    /// The level the IRQ line was last driven to.
    irq_high: bool,
}

/// The transport's registers, its queues and its device's own state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportState<S> {
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    interrupt_status: u32,
    irq_high: bool,
    queues: Vec<SavedQueue>,
    device: S,
}

/// A queue's state; virtio-queue's `QueueState` has no serde support.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SavedQueue(#[serde(with = "QueueStateDef")] QueueState);

/// `QueueState`'s fields, for serde.
#[derive(Serialize, Deserialize)]
#[serde(remote = "QueueState")]
#[serde(deny_unknown_fields)]
struct QueueStateDef {
    max_size: u16,
    next_avail: u16,
    next_used: u16,
    event_idx_enabled: bool,
    size: u16,
    ready: bool,
    desc_table: u64,
    avail_ring: u64,
    used_ring: u64,
}

/// Bytes of a split virtqueue's parts for a queue of `size` entries (virtio
/// 1.1 §2.6): the descriptor table, and the rings with their index, flags
/// and event fields.
fn ring_sizes(size: u16) -> [(&'static str, u64); 3] {
    let size = u64::from(size);
    [
        ("desc_table", 16 * size),
        ("avail_ring", 6 + 2 * size),
        ("used_ring", 6 + 8 * size),
    ]
}

impl<D: VirtioDevice> MmioTransport<D> {
    /// Rebuilds saved queue `index`, refusing what the driver could not have
    /// set up: another maximum size, a size the transport refuses, or (for
    /// a ready queue of a `live` device) rings outside guest memory.
    fn restored_queue(
        &self,
        index: usize,
        saved: &QueueState,
        live: bool,
    ) -> Result<Queue, InvalidState> {
        let field = |f: &str| format!("queues[{index}].{f}");
        let max_size = self.queues[index].max_size();
        require(
            saved.max_size == max_size,
            STATE_NAME,
            field("max_size"),
            saved.max_size,
            &format!("the device's queue {index} has {max_size} entries"),
        )?;
        require(
            saved.size.is_power_of_two() && saved.size <= max_size,
            STATE_NAME,
            field("size"),
            saved.size,
            &format!("not a power of two up to {max_size}"),
        )?;
        let queue = Queue::try_from(*saved).map_err(|error| {
            InvalidState::new(STATE_NAME, field("rings"), "", error.to_string())
        })?;
        if live && saved.ready {
            let addresses = [saved.desc_table, saved.avail_ring, saved.used_ring];
            for ((name, len), address) in ring_sizes(saved.size).into_iter().zip(addresses) {
                let in_memory = usize::try_from(len).is_ok_and(|len| {
                    self.mem
                        .check_range(GuestAddress(address), len, Permissions::ReadWrite)
                });
                require(
                    in_memory,
                    STATE_NAME,
                    field(name),
                    format!("{address:#x}"),
                    &format!("{len} bytes there are not all guest memory"),
                )?;
            }
        }
        Ok(queue)
    }

    /// Refuses register values no driver can produce.
    fn validate_registers(&self, state: &TransportState<D::State>) -> Result<(), InvalidState> {
        let unknown_interrupts = state.interrupt_status & !(INT_USED_RING | INT_CONFIG);
        require(
            unknown_interrupts == 0,
            STATE_NAME,
            "interrupt_status",
            format!("{:#x}", state.interrupt_status),
            "only the used-ring and configuration bits exist",
        )?;
        require(
            state.irq_high == (state.interrupt_status != 0),
            STATE_NAME,
            "irq_high",
            state.irq_high,
            "the line follows InterruptStatus",
        )?;
        require(
            state.status & FEATURES_OK == 0 || self.features_acceptable(state.driver_features),
            STATE_NAME,
            "driver_features",
            format!("{:#x}", state.driver_features),
            "FEATURES_OK set for features the transport refuses",
        )?;
        require(
            !is_live(state.status) || state.status & FEATURES_OK != 0,
            STATE_NAME,
            "status",
            format!("{:#x}", state.status),
            "DRIVER_OK without FEATURES_OK makes the device need a reset",
        )
    }
}

impl<D: VirtioDevice> Persist for MmioTransport<D> {
    type State = TransportState<D::State>;

    fn save(&self) -> Self::State {
        TransportState {
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status,
            irq_high: self.irq_high,
            queues: self.queues.iter().map(|q| SavedQueue(q.state())).collect(),
            device: self.device.save(),
        }
    }

    /// Puts back a saved state. The IRQ line's level is part of the
    /// interrupt controller's own state, so it is not driven again here.
    fn restore(&mut self, state: &Self::State) -> Result<(), InvalidState> {
        require(
            state.queues.len() == self.queues.len(),
            STATE_NAME,
            "queues",
            format!("{} queues", state.queues.len()),
            &format!("the device has {}", self.queues.len()),
        )?;
        let live = is_live(state.status);
        let queues = state
            .queues
            .iter()
            .enumerate()
            .map(|(index, saved)| self.restored_queue(index, &saved.0, live))
            .collect::<Result<Vec<_>, _>>()?;
        self.validate_registers(state)?;
        // Last: the device leaves itself unchanged if it refuses.
        self.device.restore(&state.device)?;
        self.queues = queues;
        self.status = state.status;
        self.device_features_sel = state.device_features_sel;
        self.driver_features_sel = state.driver_features_sel;
        self.driver_features = state.driver_features;
        self.queue_sel = state.queue_sel;
        self.interrupt_status = state.interrupt_status;
        self.irq_high = state.irq_high;
        Ok(())
    }
}

impl<D: VirtioDevice> MmioTransport<D> {
    pub fn new(
        device: D,
        mem: crate::memory::GuestMemory,
        irq: SharedIrqLine,
    ) -> Result<Self, Error> {
        let queues = device
            .queue_max_sizes()
            .iter()
            .enumerate()
            .map(|(index, &size)| Queue::new(size).map_err(|_| Error::QueueMaxSize { index, size }))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            device,
            mem,
            irq,
            queues,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            interrupt_status: 0,
            irq_high: false,
        })
    }

    /// Lets the host act on the device between vCPU runs, with the same
    /// access to the queues (empty while the device is not live) that a
    /// driver notification gets. Raises the used-buffer interrupt if `f`
    /// returned chains to the driver.
    pub fn with_device<R>(&mut self, f: impl FnOnce(&mut D, &mut DeviceQueues<'_>) -> R) -> R {
        let live_queues: &mut [Queue] = if is_live(self.status) {
            &mut self.queues
        } else {
            &mut []
        };
        let max_chain_descriptors = self.device.max_chain_descriptors();
        let mut queues = DeviceQueues::new(&self.mem, live_queues, max_chain_descriptors);
        let result = f(&mut self.device, &mut queues);
        if queues.used() {
            self.raise_interrupt(INT_USED_RING);
        }
        result
    }

    fn raise_interrupt(&mut self, bits: u32) {
        self.interrupt_status |= bits;
        self.update_irq();
    }

    /// Keeps the line level with InterruptStatus != 0, driving only changes.
    fn update_irq(&mut self) {
        let high = self.interrupt_status != 0;
        if high != self.irq_high {
            self.irq_high = high;
            self.irq.set_level(high);
        }
    }

    /// Marks the device broken and tells the driver (virtio 1.1 §2.1.2).
    fn needs_reset(&mut self, why: &str) {
        warn!(
            device = self.device.device_type(),
            "virtio: {why}; device needs reset"
        );
        self.status |= DEVICE_NEEDS_RESET;
        self.raise_interrupt(INT_CONFIG);
    }

    /// Device reset (virtio 1.1 §2.1.1, status written 0). Device state that
    /// outlives a driver, like the console's host buffers, is kept.
    fn reset(&mut self) {
        self.queues.iter_mut().for_each(Queue::reset);
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.interrupt_status = 0;
        self.update_irq();
    }

    fn read_register(&self, offset: u64) -> u32 {
        match offset {
            MAGIC_VALUE => MAGIC,
            VERSION => MMIO_VERSION,
            DEVICE_ID => self.device.device_type(),
            VENDOR_ID => VENDOR,
            DEVICE_FEATURES => feature_page(self.device.features(), self.device_features_sel),
            QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| q.max_size().into()),
            QUEUE_READY => self.selected_queue().is_some_and(|q| q.ready()).into(),
            INTERRUPT_STATUS => self.interrupt_status,
            STATUS => self.status,
            // The configuration never changes under the driver.
            CONFIG_GENERATION => 0,
            _ => {
                warn!(
                    offset,
                    "virtio-mmio: read of unknown or write-only register"
                );
                0
            }
        }
    }

    fn write_register(&mut self, offset: u64, value: u32) {
        match offset {
            DEVICE_FEATURES_SEL => self.device_features_sel = value,
            DRIVER_FEATURES => self.write_driver_features(value),
            DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            QUEUE_SEL => self.queue_sel = value,
            QUEUE_NUM => self.configure_queue(|q| {
                q.try_set_size(u16::try_from(value).map_err(|_| QueueError::InvalidSize)?)
            }),
            QUEUE_READY => self.configure_queue(|q| {
                q.set_ready(value == 1);
                Ok(())
            }),
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH => self.configure_queue(|q| {
                q.try_set_desc_table_address(set_half(q.desc_table(), offset, value))
            }),
            QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH => self.configure_queue(|q| {
                q.try_set_avail_ring_address(set_half(q.avail_ring(), offset, value))
            }),
            QUEUE_DEVICE_LOW | QUEUE_DEVICE_HIGH => self.configure_queue(|q| {
                q.try_set_used_ring_address(set_half(q.used_ring(), offset, value))
            }),
            QUEUE_NOTIFY => self.notify(value),
            INTERRUPT_ACK => {
                self.interrupt_status &= !value;
                self.update_irq();
            }
            STATUS => self.write_status(value),
            _ => warn!(
                offset,
                value, "virtio-mmio: write to unknown or read-only register"
            ),
        }
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_sel as usize)
    }

    /// Applies a driver write to the selected queue's configuration, allowed
    /// only before DRIVER_OK (virtio 1.1 §3.1.1 step 7).
    fn configure_queue(&mut self, write: impl FnOnce(&mut Queue) -> Result<(), QueueError>) {
        let sel = self.queue_sel;
        if self.status & DRIVER_OK != 0 {
            warn!(
                queue = sel,
                "virtio-mmio: queue configured after DRIVER_OK, ignored"
            );
            return;
        }
        let Some(queue) = self.queues.get_mut(sel as usize) else {
            warn!(
                queue = sel,
                "virtio-mmio: configuring a queue that does not exist"
            );
            return;
        };
        if let Err(e) = write(queue) {
            warn!(queue = sel, "virtio-mmio: bad queue configuration: {e}");
        }
    }

    fn write_driver_features(&mut self, value: u32) {
        if self.status & FEATURES_OK != 0 {
            warn!("virtio-mmio: driver features written after FEATURES_OK, ignored");
            return;
        }
        let shift = match self.driver_features_sel {
            0 => 0,
            1 => 32,
            sel => {
                warn!(sel, "virtio-mmio: driver features page out of range");
                return;
            }
        };
        self.driver_features &= !(0xffff_ffff_u64 << shift);
        self.driver_features |= u64::from(value) << shift;
    }

    /// Device status transitions (virtio 1.1 §2.1, §3.1.1).
    fn write_status(&mut self, value: u32) {
        if value == 0 {
            return self.reset();
        }
        if value & self.status != self.status {
            let status = self.status;
            warn!(
                value,
                status, "virtio-mmio: driver cleared status bits, ignored"
            );
            return;
        }
        let added = value & !self.status;
        self.status = value;
        if added & FEATURES_OK != 0 && !self.features_acceptable(self.driver_features) {
            // The driver re-reads the status and sees FEATURES_OK refused.
            warn!(
                features = self.driver_features,
                "virtio-mmio: refusing driver features"
            );
            self.status &= !FEATURES_OK;
        }
        if added & DRIVER_OK != 0 {
            self.activate();
        }
    }

    /// Only offered features, and VIRTIO_F_VERSION_1 (legacy is not offered).
    fn features_acceptable(&self, features: u64) -> bool {
        let offered = self.device.features();
        features & !offered == 0 && features & VIRTIO_F_VERSION_1 != 0
    }

    fn activate(&mut self) {
        if self.status & FEATURES_OK == 0 {
            return self.needs_reset("DRIVER_OK without FEATURES_OK");
        }
        let mem = &self.mem;
        if !self
            .queues
            .iter()
            .filter(|q| q.ready())
            .all(|q| q.is_valid(mem))
        {
            return self.needs_reset("queue rings outside guest memory");
        }
        self.with_device(|device, queues| device.activate(queues));
    }

    /// QueueNotify: the value is the queue index (virtio 1.1 §4.2.2). The
    /// queue's work is done now, synchronously, before the vCPU resumes.
    fn notify(&mut self, index: u32) {
        if !is_live(self.status) {
            warn!(index, "virtio-mmio: notify while device not live, ignored");
            return;
        }
        let index = index as usize;
        self.with_device(|device, queues| match queues.get(index) {
            Some(mut queue) => device.process_queue(index, &mut queue),
            None => warn!(index, "virtio-mmio: notify of a missing or unready queue"),
        });
    }
}

impl<D: VirtioDevice> BusDevice for MmioTransport<D> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG {
            return self.device.read_config(offset - CONFIG, data);
        }
        data.fill(0);
        if is_register_access(offset, data.len()) {
            data.copy_from_slice(&self.read_register(offset).to_le_bytes());
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG {
            return self.device.write_config(offset - CONFIG, data);
        }
        if let (true, Ok(bytes)) = (is_register_access(offset, data.len()), data.try_into()) {
            self.write_register(offset, u32::from_le_bytes(bytes));
        }
    }
}

/// The driver has set DRIVER_OK and the device needs no reset: its queues
/// are in use.
fn is_live(status: u32) -> bool {
    status & (DRIVER_OK | DEVICE_NEEDS_RESET | FAILED) == DRIVER_OK
}

/// Registers take aligned 32-bit accesses only (virtio 1.1 §4.2.2.2).
fn is_register_access(offset: u64, len: usize) -> bool {
    let ok = len == 4 && offset.is_multiple_of(4);
    if !ok {
        warn!(
            offset,
            len, "virtio-mmio: register access not 32-bit aligned, ignored"
        );
    }
    ok
}

/// 32-bit page `sel` of the 64 feature bits; pages past them read 0.
fn feature_page(features: u64, sel: u32) -> u32 {
    match sel {
        0 => features as u32,
        1 => (features >> 32) as u32,
        _ => 0,
    }
}

/// `addr` with its low or high half replaced: each address is a Low/High
/// register pair at an 8-byte aligned offset.
fn set_half(addr: u64, offset: u64, value: u32) -> GuestAddress {
    let value = u64::from(value);
    GuestAddress(if offset.is_multiple_of(8) {
        (addr & !0xffff_ffff) | value
    } else {
        (addr & 0xffff_ffff) | (value << 32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::testing::*;
    use crate::devices::virtio::QueueIo;

    const FEATURE_BIT_3: u64 = 1 << 3;

    /// Returns every chain unwritten and remembers notifies, its state.
    struct Dummy {
        notified: Vec<usize>,
        queue_sizes: Vec<u16>,
    }

    impl Dummy {
        /// Two queues.
        fn new() -> Self {
            Self::with_queues(&[QUEUE_LEN, 2 * QUEUE_LEN])
        }

        fn with_queues(sizes: &[u16]) -> Self {
            Self {
                notified: Vec::new(),
                queue_sizes: sizes.to_vec(),
            }
        }
    }

    impl Persist for Dummy {
        type State = Vec<usize>;

        fn save(&self) -> Vec<usize> {
            self.notified.clone()
        }

        fn restore(&mut self, state: &Vec<usize>) -> Result<(), InvalidState> {
            self.notified = state.clone();
            Ok(())
        }
    }

    impl VirtioDevice for Dummy {
        fn device_type(&self) -> u32 {
            42
        }
        fn features(&self) -> u64 {
            VIRTIO_F_VERSION_1 | FEATURE_BIT_3
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &self.queue_sizes
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            super::super::read_config_bytes(&[1, 2, 3, 4, 5, 6], offset, data);
        }
        fn process_queue(&mut self, index: usize, queue: &mut QueueIo<'_>) {
            self.notified.push(index);
            while queue.serve_one(|_, _| 0) {}
        }
    }

    fn notified(t: &mut MmioTransport<Dummy>) -> Vec<usize> {
        t.with_device(|dummy, _| dummy.notified.clone())
    }

    #[test]
    fn identification_registers() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        assert_eq!(read_reg(&mut t, MAGIC_VALUE), 0x7472_6976);
        assert_eq!(read_reg(&mut t, VERSION), 2);
        assert_eq!(read_reg(&mut t, DEVICE_ID), 42);
        assert_eq!(read_reg(&mut t, VENDOR_ID), u32::from_le_bytes(*b"prvm"));
        assert_eq!(read_reg(&mut t, CONFIG_GENERATION), 0);
    }

    #[test]
    fn feature_pages_by_select() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        assert_eq!(read_reg(&mut t, DEVICE_FEATURES), 1 << 3);
        write_reg(&mut t, DEVICE_FEATURES_SEL, 1);
        assert_eq!(read_reg(&mut t, DEVICE_FEATURES), 1);
        write_reg(&mut t, DEVICE_FEATURES_SEL, 2);
        assert_eq!(read_reg(&mut t, DEVICE_FEATURES), 0);
    }

    #[test]
    fn queue_sizes_by_select() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        assert_eq!(read_reg(&mut t, QUEUE_NUM_MAX), u32::from(QUEUE_LEN));
        write_reg(&mut t, QUEUE_SEL, 1);
        assert_eq!(read_reg(&mut t, QUEUE_NUM_MAX), 2 * u32::from(QUEUE_LEN));
        // A queue that does not exist reads as unavailable.
        write_reg(&mut t, QUEUE_SEL, 2);
        assert_eq!(read_reg(&mut t, QUEUE_NUM_MAX), 0);
        write_reg(&mut t, QUEUE_READY, 1);
        assert_eq!(read_reg(&mut t, QUEUE_READY), 0);
    }

    #[test]
    fn config_space_goes_to_the_device() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        let mut data = [0u8; 4];
        t.read(CONFIG + 2, &mut data);
        assert_eq!(data, [3, 4, 5, 6]);
        let mut byte = [0xff];
        t.read(CONFIG + 6, &mut byte);
        assert_eq!(byte, [0]);
    }

    #[test]
    fn handshake_notify_and_interrupt_ack() {
        let mem = guest_memory();
        let (mut t, irq) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        initialize(&mut t, &[&q0, &q1]);
        assert_eq!(
            read_reg(&mut t, STATUS),
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
        );
        write_reg(&mut t, QUEUE_SEL, 1);
        assert_eq!(read_reg(&mut t, QUEUE_READY), 1);

        add_chain(&q1, 0, &[(DATA, 16, DESC_F_WRITE)]);
        write_reg(&mut t, QUEUE_NOTIFY, 1);
        assert_eq!(notified(&mut t), [1]);
        assert_eq!(used(&q1), [(0, 0)]);
        assert_eq!(read_reg(&mut t, INTERRUPT_STATUS), INT_USED_RING);
        assert!(irq.is_high());

        write_reg(&mut t, INTERRUPT_ACK, INT_USED_RING);
        assert_eq!(read_reg(&mut t, INTERRUPT_STATUS), 0);
        assert_eq!(irq.levels(), [true, false]);
    }

    #[test]
    fn notify_without_used_buffers_raises_nothing() {
        let mem = guest_memory();
        let (mut t, irq) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        initialize(&mut t, &[&q0, &q1]);
        write_reg(&mut t, QUEUE_NOTIFY, 0);
        assert_eq!(notified(&mut t), [0]);
        assert!(irq.levels().is_empty());
    }

    #[test]
    fn refuses_features_without_version_1() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER);
        write_reg(&mut t, DRIVER_FEATURES, 1 << 3);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_eq!(read_reg(&mut t, STATUS), ACKNOWLEDGE | DRIVER);
    }

    #[test]
    fn refuses_features_not_offered() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER);
        write_reg(&mut t, DRIVER_FEATURES, 1 << 4);
        write_reg(&mut t, DRIVER_FEATURES_SEL, 1);
        write_reg(&mut t, DRIVER_FEATURES, 1);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        assert_eq!(read_reg(&mut t, STATUS) & FEATURES_OK, 0);
    }

    #[test]
    fn driver_ok_without_features_ok_needs_reset() {
        let mem = guest_memory();
        let (mut t, irq) = transport(Dummy::new(), &mem);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER | DRIVER_OK);
        assert_ne!(read_reg(&mut t, STATUS) & DEVICE_NEEDS_RESET, 0);
        assert_eq!(read_reg(&mut t, INTERRUPT_STATUS), INT_CONFIG);
        assert!(irq.is_high());
    }

    #[test]
    fn rings_outside_memory_need_reset_and_block_notifies() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER);
        write_reg(&mut t, DRIVER_FEATURES_SEL, 1);
        write_reg(&mut t, DRIVER_FEATURES, 1);
        write_reg(&mut t, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        write_reg(&mut t, QUEUE_DESC_HIGH, 0x10);
        write_reg(&mut t, QUEUE_READY, 1);
        write_reg(
            &mut t,
            STATUS,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        );
        assert_ne!(read_reg(&mut t, STATUS) & DEVICE_NEEDS_RESET, 0);
        write_reg(&mut t, QUEUE_NOTIFY, 0);
        assert!(notified(&mut t).is_empty());
    }

    #[test]
    fn reset_clears_status_queues_and_interrupt() {
        let mem = guest_memory();
        let (mut t, irq) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        initialize(&mut t, &[&q0, &q1]);
        add_chain(&q0, 0, &[(DATA, 16, 0)]);
        write_reg(&mut t, QUEUE_NOTIFY, 0);
        write_reg(&mut t, STATUS, 0);
        assert_eq!(read_reg(&mut t, STATUS), 0);
        assert_eq!(read_reg(&mut t, INTERRUPT_STATUS), 0);
        assert_eq!(read_reg(&mut t, QUEUE_READY), 0);
        assert_eq!(irq.levels(), [true, false]);
        // The device comes back with a new driver.
        initialize(&mut t, &[&mock_queue(&mem, 2), &mock_queue(&mem, 3)]);
    }

    #[test]
    fn ignores_protocol_violations() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        // Notify before the device is live.
        add_chain(&q0, 0, &[(DATA, 16, 0)]);
        write_reg(&mut t, QUEUE_NOTIFY, 0);
        assert!(notified(&mut t).is_empty());

        initialize(&mut t, &[&q0, &q1]);
        // Clearing status bits, notifying a missing queue, reconfiguring a
        // live queue, unaligned and narrow register accesses.
        write_reg(&mut t, STATUS, ACKNOWLEDGE);
        write_reg(&mut t, QUEUE_NOTIFY, 7);
        write_reg(&mut t, QUEUE_SEL, 0);
        write_reg(&mut t, QUEUE_READY, 0);
        write_reg(&mut t, QUEUE_DESC_LOW, 0x8000);
        write_reg(&mut t, 0x0ff, 0);
        write_reg(&mut t, 0x0f8, 0);
        t.write(STATUS, &[0]);
        let mut narrow = [0xffu8; 2];
        t.read(MAGIC_VALUE, &mut narrow);
        assert_eq!(narrow, [0, 0]);
        assert_eq!(read_reg(&mut t, QUEUE_NOTIFY), 0);

        assert_eq!(
            read_reg(&mut t, STATUS),
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
        );
        write_reg(&mut t, QUEUE_NOTIFY, 0);
        assert_eq!(notified(&mut t), [0]);
        assert_eq!(used(&q0), [(0, 0)]);
    }

    #[test]
    fn survives_garbage_in_every_register() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        for value in [u32::MAX, 0x8000_0001] {
            for offset in (0..0x200).step_by(4) {
                write_reg(&mut t, offset, value);
                read_reg(&mut t, offset);
            }
        }
    }

    #[test]
    fn survives_a_head_index_outside_the_queue() {
        let mem = guest_memory();
        let (mut t, irq) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        initialize(&mut t, &[&q0, &q1]);
        q0.avail().ring().ref_at(0).unwrap().store(u16::MAX);
        q0.avail().idx().store(1);
        write_reg(&mut t, QUEUE_NOTIFY, 0);
        assert!(used(&q0).is_empty());
        assert!(irq.levels().is_empty());
    }

    #[test]
    fn rejects_invalid_queue_sizes() {
        let irq = std::sync::Arc::new(RecordingIrq::default());
        assert!(matches!(
            MmioTransport::new(Dummy::with_queues(&[3]), guest_memory(), irq),
            Err(Error::QueueMaxSize { index: 0, size: 3 })
        ));
    }

    #[test]
    fn state_round_trips() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        initialize(&mut t, &[&q0, &q1]);
        add_chain(&q1, 0, &[(DATA, 16, DESC_F_WRITE)]);
        write_reg(&mut t, QUEUE_NOTIFY, 1);
        let saved = t.save();

        let (mut restored, _) = transport(Dummy::new(), &mem);
        restored.restore(&saved).unwrap();
        assert_eq!(restored.save(), saved);
        assert_eq!(notified(&mut restored), [1]);
        assert_eq!(read_reg(&mut restored, INTERRUPT_STATUS), INT_USED_RING);
        // Live, and the queue goes on where it was.
        add_chain(&q1, 1, &[(DATA, 16, DESC_F_WRITE)]);
        write_reg(&mut restored, QUEUE_NOTIFY, 1);
        assert_eq!(used(&q1), [(0, 0), (1, 0)]);
    }

    #[test]
    fn restore_refuses_queues_and_registers_no_driver_sets_up() {
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        let (q0, q1) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        initialize(&mut t, &[&q0, &q1]);
        let good = t.save();
        let refused = |edit: &dyn Fn(&mut TransportState<Vec<usize>>)| {
            let mut state = good.clone();
            edit(&mut state);
            let (mut target, _) = transport(Dummy::new(), &mem);
            let before = target.save();
            let error = target.restore(&state).unwrap_err();
            assert_eq!(target.save(), before, "left unchanged");
            error.field
        };
        assert_eq!(refused(&|s| s.queues[0].0.size = 3), "queues[0].size");
        assert_eq!(
            refused(&|s| s.queues[0].0.size = 2 * QUEUE_LEN),
            "queues[0].size"
        );
        assert_eq!(
            refused(&|s| s.queues[1].0.max_size = 64),
            "queues[1].max_size"
        );
        assert_eq!(
            refused(&|s| s.queues[0].0.desc_table = 1 << 40),
            "queues[0].desc_table"
        );
        assert_eq!(
            refused(&|s| s.queues[1].0.used_ring = 0x20_0000 - 8),
            "queues[1].used_ring"
        );
        assert_eq!(
            refused(&|s| {
                s.queues.pop();
            }),
            "queues"
        );
        assert_eq!(refused(&|s| s.interrupt_status = 4), "interrupt_status");
        assert_eq!(refused(&|s| s.irq_high = true), "irq_high");
        assert_eq!(refused(&|s| s.driver_features |= 1 << 5), "driver_features");
        assert_eq!(refused(&|s| s.status &= !FEATURES_OK), "status");
        assert_eq!(
            refused(&|s| s.queues[0].0.used_ring += 2),
            "queues[0].rings"
        );
    }

    #[test]
    fn restore_keeps_unchecked_rings_of_a_device_not_live() {
        // A driver may make a queue ready with rings outside memory; only
        // DRIVER_OK checks them (and makes the device need a reset).
        let mem = guest_memory();
        let (mut t, _) = transport(Dummy::new(), &mem);
        write_reg(&mut t, QUEUE_DESC_HIGH, 0x10);
        write_reg(&mut t, QUEUE_READY, 1);
        let saved = t.save();
        let (mut restored, _) = transport(Dummy::new(), &mem);
        restored.restore(&saved).unwrap();
        assert_eq!(restored.save(), saved);
    }
}
