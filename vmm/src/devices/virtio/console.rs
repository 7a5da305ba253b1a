//! virtio-console (virtio 1.1 §5.3) with a single port: the byte channel
//! between the host and the guest agent, which opens it as /dev/hvc0.
//!
//! Host-to-guest bytes wait in a buffer until the driver posts receive
//! buffers; guest-to-host bytes are taken from transmit buffers at the
//! driver's notification and held until the host collects them. Linux's hvc
//! driver spins until a transmit buffer comes back, so transmitq is always
//! completed before the vCPU resumes.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{Read, Write};

use super::{Reader, Writer};
use tracing::warn;

use super::mmio::MmioTransport;
use super::{DeviceQueues, QueueIo, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::devices::persist::{require, InvalidState, Persist};

const DEVICE_ID: u32 = 3;
/// Port 0's queues: no VIRTIO_CONSOLE_F_MULTIPORT, so no control queues.
const RECEIVEQ: usize = 0;
const TRANSMITQ: usize = 1;
/// Small rings: Linux allocates and posts a page for every receive slot at
/// probe time, work that costs seconds of boot where ring 0 is emulated. The
/// channel carries small messages in, and hvc sends one buffer at a time out.
const QUEUE_SIZES: &[u16] = &[8, 8];
/// The most one transmit chain may carry. hvc sends at most a page at a
/// time; a chain of overlapping descriptors can describe 4 GiB, which the
/// device would otherwise copy into one buffer. A longer chain is dropped.
pub(crate) const MAX_TRANSMIT_CHAIN: usize = 64 * 1024;
/// The most guest bytes held for the host. While one more chain could pass
/// it, transmit chains wait in the ring for the driver's next notify.
pub(crate) const MAX_PENDING_OUTPUT: usize = 16 * MAX_TRANSMIT_CHAIN;

/// A single-port virtio console. The host side is driven through
/// [`MmioTransport::send_to_guest`] and [`MmioTransport::take_from_guest`].
#[derive(Default)]
pub struct VirtioConsole {
    /// Host bytes not yet placed in a receive buffer.
    to_guest: VecDeque<u8>,
    /// Guest bytes the host has not collected yet.
    from_guest: Vec<u8>,
}

impl VirtioConsole {
    pub fn new() -> Self {
        Self::default()
    }

    /// Delivers pending host bytes if the device is live.
    fn deliver_pending(&mut self, queues: &mut DeviceQueues<'_>) {
        if let Some(mut receiveq) = queues.get(RECEIVEQ) {
            self.deliver(&mut receiveq);
        }
    }

    /// Fills the driver's receive buffers with pending host bytes.
    fn deliver(&mut self, receiveq: &mut QueueIo<'_>) {
        while !self.to_guest.is_empty() && receiveq.serve_one(|_, writer| self.receive(writer)) {}
    }

    /// Moves as many pending bytes as fit into one receive buffer.
    fn receive(&mut self, mut buffer: Writer<'_>) -> u32 {
        let len = buffer.available_bytes().min(self.to_guest.len());
        if let Err(e) = buffer.write_all(&self.to_guest.make_contiguous()[..len]) {
            warn!("virtio-console: receive buffer write failed: {e}");
        }
        self.to_guest.drain(..buffer.bytes_written());
        // Bounded by the chain's length, a u32 (virtio 1.1 §2.6.5).
        buffer.bytes_written() as u32
    }

    /// Collects the driver's transmit buffers while the host has room for
    /// another chain.
    fn transmit_all(&mut self, transmitq: &mut QueueIo<'_>) {
        while self.from_guest.len() + MAX_TRANSMIT_CHAIN <= MAX_PENDING_OUTPUT
            && transmitq.serve_one(|reader, _| self.transmit(reader))
        {}
    }

    /// Collects one transmit buffer; the device writes nothing back.
    fn transmit(&mut self, mut buffer: Reader<'_>) -> u32 {
        let len = buffer.available_bytes();
        if len > MAX_TRANSMIT_CHAIN {
            warn!(
                len,
                "virtio-console: transmit chain over {MAX_TRANSMIT_CHAIN} bytes, dropped"
            );
            return 0;
        }
        if let Err(e) = buffer.read_to_end(&mut self.from_guest) {
            warn!("virtio-console: transmit buffer read failed: {e}");
        }
        0
    }
}

/// Host bytes waiting for the guest, and guest bytes for the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleState {
    to_guest: Vec<u8>,
    from_guest: Vec<u8>,
}

impl Persist for VirtioConsole {
    type State = ConsoleState;

    fn save(&self) -> ConsoleState {
        ConsoleState {
            to_guest: self.to_guest.iter().copied().collect(),
            from_guest: self.from_guest.clone(),
        }
    }

    fn restore(&mut self, state: &ConsoleState) -> Result<(), InvalidState> {
        let pending = state.from_guest.len();
        require(
            pending <= MAX_PENDING_OUTPUT,
            "virtio-console",
            "from_guest",
            format!("{pending} bytes"),
            &format!("the device holds at most {MAX_PENDING_OUTPUT}"),
        )?;
        self.to_guest = state.to_guest.iter().copied().collect();
        self.from_guest = state.from_guest.clone();
        Ok(())
    }
}

impl VirtioDevice for VirtioConsole {
    fn device_type(&self) -> u32 {
        DEVICE_ID
    }

    /// No VIRTIO_CONSOLE_F_SIZE/MULTIPORT/EMERG_WRITE, so no configuration
    /// fields either (virtio 1.1 §5.3.4).
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        QUEUE_SIZES
    }

    /// Host bytes queued before the driver came up go out now if it
    /// already posted receive buffers.
    fn activate(&mut self, queues: &mut DeviceQueues<'_>) {
        self.deliver_pending(queues);
    }

    fn process_queue(&mut self, index: usize, queue: &mut QueueIo<'_>) {
        match index {
            RECEIVEQ => self.deliver(queue),
            TRANSMITQ => self.transmit_all(queue),
            _ => warn!(index, "virtio-console: notify of an unknown queue"),
        }
    }
}

/// The host's side of the channel, for the vCPU loop between runs.
impl MmioTransport<VirtioConsole> {
    /// Queues `bytes` for the guest and delivers what fits into the receive
    /// buffers posted so far, raising the interrupt if any went out; the
    /// rest follows as the driver posts more.
    pub fn send_to_guest(&mut self, bytes: &[u8]) {
        self.with_device(|console, queues| {
            console.to_guest.extend(bytes);
            console.deliver_pending(queues);
        });
    }

    /// The bytes the guest transmitted since the last call.
    pub fn take_from_guest(&mut self) -> Vec<u8> {
        self.with_device(|console, _| std::mem::take(&mut console.from_guest))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use crate::memory::GuestMemory;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::bus::Bus;
    use crate::devices::virtio::mmio::regs;
    use crate::devices::virtio::testing::*;

    /// Console with both queues set up by the driver.
    fn live_console(
        mem: &GuestMemory,
    ) -> (
        MmioTransport<VirtioConsole>,
        Arc<RecordingIrq>,
        [virtio_queue::mock::MockSplitQueue<'_, GuestMemory>; 2],
    ) {
        let (mut t, irq) = transport(VirtioConsole::new(), mem);
        let queues = [mock_queue(mem, 0), mock_queue(mem, 1)];
        initialize(&mut t, &[&queues[0], &queues[1]]);
        (t, irq, queues)
    }

    fn guest_bytes(mem: &GuestMemory, addr: u64, len: usize) -> Vec<u8> {
        let mut data = vec![0; len];
        mem.read_slice(&mut data, GuestAddress(addr)).unwrap();
        data
    }

    #[test]
    fn identifies_as_single_port_console() {
        let mem = guest_memory();
        let (mut t, _) = transport(VirtioConsole::new(), &mem);
        assert_eq!(read_reg(&mut t, regs::DEVICE_ID), 3);
        assert_eq!(read_reg(&mut t, regs::DEVICE_FEATURES), 0);
        write_reg(&mut t, regs::DEVICE_FEATURES_SEL, 1);
        assert_eq!(read_reg(&mut t, regs::DEVICE_FEATURES), 1);
    }

    #[test]
    fn guest_transmits_to_host() {
        let mem = guest_memory();
        let (mut t, irq, [_, tx]) = live_console(&mem);
        mem.write_slice(b"hello, host", GuestAddress(DATA)).unwrap();
        add_chain(&tx, 0, &[(DATA, 5, 0), (DATA + 5, 6, 0)]);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        // Returned before the vCPU runs again, as hvc's put_chars spins on it.
        assert_eq!(used(&tx), [(0, 0)]);
        assert!(irq.is_high());
        assert_eq!(t.take_from_guest(), b"hello, host");
        assert!(t.take_from_guest().is_empty());
    }

    #[test]
    fn host_bytes_wait_for_receive_buffers() {
        let mem = guest_memory();
        let (mut t, irq, [rx, _]) = live_console(&mem);
        t.send_to_guest(b"0123456789ab");
        assert!(irq.levels().is_empty());

        add_chain(&rx, 0, &[(DATA, 8, DESC_F_WRITE)]);
        add_chain(&rx, 1, &[(DATA + 0x100, 8, DESC_F_WRITE)]);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
        assert_eq!(used(&rx), [(0, 8), (1, 4)]);
        assert_eq!(guest_bytes(&mem, DATA, 8), b"01234567");
        assert_eq!(guest_bytes(&mem, DATA + 0x100, 4), b"89ab");
        assert_eq!(irq.levels(), [true]);
    }

    #[test]
    fn host_bytes_fill_posted_buffers_at_once() {
        let mem = guest_memory();
        let (mut t, irq, [rx, _]) = live_console(&mem);
        add_chain(&rx, 0, &[(DATA, 4, DESC_F_WRITE)]);
        add_chain(&rx, 1, &[(DATA + 0x100, 4, DESC_F_WRITE)]);
        // Nothing to deliver: the driver's buffers stay posted.
        write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
        assert!(used(&rx).is_empty());

        t.send_to_guest(b"ping");
        assert_eq!(used(&rx), [(0, 4)]);
        assert_eq!(guest_bytes(&mem, DATA, 4), b"ping");
        assert!(irq.is_high());

        write_reg(&mut t, regs::INTERRUPT_ACK, regs::INT_USED_RING);
        t.send_to_guest(b"pong");
        assert_eq!(used(&rx), [(0, 4), (1, 4)]);
        assert_eq!(irq.levels(), [true, false, true]);
    }

    #[test]
    fn host_bytes_sent_before_the_driver_arrive_at_driver_ok() {
        let mem = guest_memory();
        let (mut t, irq) = transport(VirtioConsole::new(), &mem);
        t.send_to_guest(b"early");
        let (rx, tx) = (mock_queue(&mem, 0), mock_queue(&mem, 1));
        add_chain(&rx, 0, &[(DATA, 64, DESC_F_WRITE)]);
        initialize(&mut t, &[&rx, &tx]);
        assert_eq!(used(&rx), [(0, 5)]);
        assert_eq!(guest_bytes(&mem, DATA, 5), b"early");
        assert!(irq.is_high());
    }

    #[test]
    fn driven_through_the_mmio_bus() {
        let mem = guest_memory();
        let (t, _) = transport(VirtioConsole::new(), &mem);
        let console = Arc::new(Mutex::new(t));
        let mut bus = Bus::default();
        bus.insert(0xd000_0000, 0x1000, console.clone()).unwrap();
        let mut magic = [0u8; 4];
        assert!(bus.read(0xd000_0000, &mut magic));
        assert_eq!(&magic, b"virt");
        console.lock().unwrap().send_to_guest(b"queued");
    }

    #[test]
    fn state_round_trips() {
        let mem = guest_memory();
        let (mut t, _, [_, tx]) = live_console(&mem);
        t.send_to_guest(b"waiting");
        mem.write_slice(b"untaken", GuestAddress(DATA)).unwrap();
        add_chain(&tx, 0, &[(DATA, 7, 0)]);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        let saved = t.save();
        let (mut restored, _) = transport(VirtioConsole::new(), &mem);
        restored.restore(&saved).unwrap();
        assert_eq!(restored.save(), saved);
        assert_eq!(restored.take_from_guest(), b"untaken");
    }

    #[test]
    fn restore_refuses_more_output_than_the_device_holds() {
        let mut console = VirtioConsole::new();
        let mut state = console.save();
        state.from_guest = vec![0; MAX_PENDING_OUTPUT + 1];
        let error = console.restore(&state).unwrap_err();
        assert_eq!(error.field, "from_guest");
        assert!(console.from_guest.is_empty(), "left unchanged");
    }

    #[test]
    fn transmit_chain_over_the_cap_is_dropped() {
        let mem = guest_memory();
        let (mut t, _, [_, tx]) = live_console(&mem);
        // Overlapping descriptors: more bytes than the memory they cover.
        let half = (MAX_TRANSMIT_CHAIN / 2 + 1) as u32;
        add_chain(&tx, 0, &[(DATA, half, 0), (DATA, half, 0)]);
        add_chain(&tx, 2, &[(DATA, 3, 0)]);
        mem.write_slice(b"yes", GuestAddress(DATA)).unwrap();
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        assert_eq!(used(&tx), [(0, 0), (2, 0)]);
        assert_eq!(t.take_from_guest(), b"yes");
    }

    #[test]
    fn transmit_waits_while_the_host_has_no_room() {
        let mem = guest_memory();
        let (mut t, _, [_, tx]) = live_console(&mem);
        let almost_full = MAX_PENDING_OUTPUT - MAX_TRANSMIT_CHAIN + 1;
        t.with_device(|console, _| console.from_guest = vec![0; almost_full]);
        add_chain(&tx, 0, &[(DATA, 5, 0)]);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        assert!(used(&tx).is_empty());
        assert_eq!(t.take_from_guest().len(), almost_full);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        assert_eq!(used(&tx), [(0, 0)]);
        assert_eq!(t.take_from_guest().len(), 5);
    }
}
