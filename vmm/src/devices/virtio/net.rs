//! virtio-net (virtio 1.1 §5.1) with one queue pair: the guest's network
//! interface for `provm run --net`. Frames cross the seam: every frame the
//! guest sends goes to `Seam::net_send` at the driver's notification, and
//! frames for the guest come from `Seam::net_receive`, asked by the run
//! loop right after a VM exit (`MmioTransport::receive_frames`) and only
//! while the driver has a receive buffer posted, so that a replay asks at
//! the same exits and finds them in its log.
//!
//! No offloads but the receive checksum: the guest computes its own
//! checksums and segments, and trusts the host's (VIRTIO_NET_F_GUEST_CSUM).
//! A large MTU (VIRTIO_NET_F_MTU) keeps the frame count, and with it the
//! guest kernel's per-packet work, low: Linux then posts "big" receive
//! buffers that hold a whole frame.

use std::io::{Read, Write};
use std::sync::Arc;

use super::{Reader, Writer};
use tracing::warn;

use super::mmio::MmioTransport;
use super::{
    read_config_bytes, QueueIo, VirtioDevice, VIRTIO_F_RING_INDIRECT_DESC, VIRTIO_F_VERSION_1,
};
use crate::devices::persist::{InvalidState, Persist};
use crate::seam::Seam;

const DEVICE_ID: u32 = 1;
const RECEIVEQ: usize = 0;
const TRANSMITQ: usize = 1;
/// Each receive buffer is a 64 KiB chain (one slot, with indirect
/// descriptors) that Linux allocates page by page at probe time: a few
/// dozen keep the pipe full without seconds of emulated-ring-0 boot.
const QUEUE_SIZES: &[u16] = &[32, 32];

/// Feature bits (virtio 1.1 §5.1.3).
const VIRTIO_NET_F_GUEST_CSUM: u64 = 1 << 1;
const VIRTIO_NET_F_MTU: u64 = 1 << 3;
const VIRTIO_NET_F_MAC: u64 = 1 << 5;

/// The guest's MAC address: QEMU's first, a locally administered one.
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// The interface's MTU (as Linux's loopback's): IP packets of up to this
/// size, in Ethernet frames 14 bytes longer.
pub const MTU: u16 = 65520;
/// The longest Ethernet frame (no FCS) either side sends.
pub const MAX_FRAME: usize = MTU as usize + 14;

/// `struct virtio_net_hdr_v1` before each frame: flags, gso_type, hdr_len,
/// gso_size, csum_start, csum_offset, num_buffers (virtio 1.1 §5.1.6).
const HEADER_LEN: usize = 12;
/// The header of every received frame: its checksums are valid
/// (VIRTIO_NET_HDR_F_DATA_VALID), no segmentation, one buffer.
const RECEIVE_HEADER: [u8; HEADER_LEN] = [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// A virtio network device whose other end is the seam.
pub struct VirtioNet {
    seam: Arc<dyn Seam>,
}

impl VirtioNet {
    pub fn new(seam: Arc<dyn Seam>) -> Self {
        Self { seam }
    }

    /// Hands the guest's transmitted frames to the seam.
    fn transmit_all(&mut self, transmitq: &mut QueueIo<'_>) {
        while transmitq.serve_one(|reader, _| self.transmit(reader)) {}
    }

    /// One transmit chain: the header, then the frame. The device writes
    /// nothing back.
    fn transmit(&mut self, mut buffer: Reader<'_>) -> u32 {
        let len = buffer.available_bytes();
        if !(HEADER_LEN..=HEADER_LEN + MAX_FRAME).contains(&len) {
            warn!(len, "virtio-net: transmit chain of a bad length, dropped");
            return 0;
        }
        let mut chain = Vec::with_capacity(len);
        if let Err(e) = buffer.read_to_end(&mut chain) {
            warn!("virtio-net: transmit buffer read failed: {e}");
            return 0;
        }
        self.seam.net_send(&chain[HEADER_LEN..]);
        0
    }
}

/// Writes `frame` into one receive buffer; returns the used length.
fn receive(mut buffer: Writer<'_>, frame: &[u8]) -> u32 {
    if buffer.available_bytes() < HEADER_LEN + frame.len() {
        warn!(
            len = frame.len(),
            room = buffer.available_bytes(),
            "virtio-net: frame larger than the receive buffer, dropped"
        );
        return 0;
    }
    let written = buffer
        .write_all(&RECEIVE_HEADER)
        .and_then(|()| buffer.write_all(frame));
    if let Err(e) = written {
        warn!("virtio-net: receive buffer write failed: {e}");
        return 0;
    }
    // At most HEADER_LEN + MAX_FRAME.
    buffer.bytes_written() as u32
}

/// Nothing beyond the transport's: frames never wait in the device.
impl Persist for VirtioNet {
    type State = ();

    fn save(&self) {}

    fn restore(&mut self, _: &()) -> Result<(), InvalidState> {
        Ok(())
    }
}

impl VirtioDevice for VirtioNet {
    fn device_type(&self) -> u32 {
        DEVICE_ID
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
            | VIRTIO_F_RING_INDIRECT_DESC
            | VIRTIO_NET_F_GUEST_CSUM
            | VIRTIO_NET_F_MTU
            | VIRTIO_NET_F_MAC
    }

    fn queue_max_sizes(&self) -> &[u16] {
        QUEUE_SIZES
    }

    /// `mac`, `status` (no VIRTIO_NET_F_STATUS: unused),
    /// `max_virtqueue_pairs` (no VIRTIO_NET_F_MQ: unused), `mtu`.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 12];
        config[..6].copy_from_slice(&GUEST_MAC);
        config[10..].copy_from_slice(&MTU.to_le_bytes());
        read_config_bytes(&config, offset, data);
    }

    fn process_queue(&mut self, index: usize, queue: &mut QueueIo<'_>) {
        match index {
            TRANSMITQ => self.transmit_all(queue),
            // New receive buffers: the run loop fills them after this exit.
            RECEIVEQ => {}
            _ => warn!(index, "virtio-net: notify of an unknown queue"),
        }
    }
}

/// The host's side, for the vCPU loop between runs.
impl MmioTransport<VirtioNet> {
    /// Whether the driver has a receive buffer posted: a frame could be
    /// delivered now.
    pub fn can_receive(&mut self) -> bool {
        self.with_device(|_, queues| queues.get(RECEIVEQ).is_some_and(|rx| rx.has_available()))
    }

    /// Fills the posted receive buffers with the frames the seam has for
    /// the guest, raising the interrupt if any went in.
    pub fn receive_frames(&mut self) {
        self.with_device(|net, queues| {
            let Some(mut receiveq) = queues.get(RECEIVEQ) else {
                return;
            };
            while receiveq.has_available() {
                let Some(frame) = net.seam.net_receive() else {
                    return;
                };
                receiveq.serve_one(|_, writer| receive(writer, &frame));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use crate::memory::GuestMemory;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::devices::virtio::mmio::regs;
    use crate::devices::virtio::testing::*;
    use crate::seam::LiveSeam;

    /// A live seam whose network is two queues the test fills and reads.
    #[derive(Default, Clone)]
    struct Wire {
        to_guest: Arc<Mutex<VecDeque<Vec<u8>>>>,
        from_guest: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl crate::network::Network for Wire {
        fn send(&mut self, frame: &[u8]) {
            self.from_guest.lock().unwrap().push(frame.to_vec());
        }
        fn receive(&mut self) -> Option<Vec<u8>> {
            self.to_guest.lock().unwrap().pop_front()
        }
        fn wait_for_frame(&mut self, _: std::time::Instant) -> bool {
            !self.to_guest.lock().unwrap().is_empty()
        }
    }

    fn live_net<'a>(
        mem: &'a GuestMemory,
        wire: &Wire,
    ) -> (
        MmioTransport<VirtioNet>,
        Arc<RecordingIrq>,
        [virtio_queue::mock::MockSplitQueue<'a, GuestMemory>; 2],
    ) {
        let seam = LiveSeam::starting_at(0).with_network(Box::new(wire.clone()));
        let (mut t, irq) = transport(VirtioNet::new(Arc::new(seam)), mem);
        let queues = [mock_queue(mem, 0), mock_queue(mem, 1)];
        initialize(&mut t, &[&queues[0], &queues[1]]);
        (t, irq, queues)
    }

    #[test]
    fn identifies_as_a_network_card_with_its_mac_and_mtu() {
        let mem = guest_memory();
        let (mut t, _) = transport(VirtioNet::new(Arc::new(LiveSeam::starting_at(0))), &mem);
        assert_eq!(read_reg(&mut t, regs::DEVICE_ID), 1);
        let mut config = [0u8; 12];
        for (i, byte) in config.iter_mut().enumerate() {
            let mut one = [0u8];
            t.with_device(|net, _| net.read_config(i as u64, &mut one));
            *byte = one[0];
        }
        assert_eq!(&config[..6], &GUEST_MAC);
        assert_eq!(u16::from_le_bytes([config[10], config[11]]), MTU);
    }

    #[test]
    fn the_guests_frames_go_to_the_seam_without_their_header() {
        let mem = guest_memory();
        let wire = Wire::default();
        let (mut t, irq, [_, tx]) = live_net(&mem, &wire);
        mem.write_slice(&[0; HEADER_LEN], GuestAddress(DATA))
            .unwrap();
        mem.write_slice(b"frame", GuestAddress(DATA + 0x100))
            .unwrap();
        add_chain(
            &tx,
            0,
            &[(DATA, HEADER_LEN as u32, 0), (DATA + 0x100, 5, 0)],
        );
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        assert_eq!(used(&tx), [(0, 0)]);
        assert!(irq.is_high());
        assert_eq!(*wire.from_guest.lock().unwrap(), [b"frame".to_vec()]);
    }

    #[test]
    fn frames_for_the_guest_wait_for_a_receive_buffer() {
        let mem = guest_memory();
        let wire = Wire::default();
        let (mut t, irq, [rx, _]) = live_net(&mem, &wire);
        wire.to_guest
            .lock()
            .unwrap()
            .extend([b"one".to_vec(), b"two".to_vec()]);
        assert!(!t.can_receive());
        t.receive_frames();
        assert!(irq.levels().is_empty());

        add_chain(&rx, 0, &[(DATA, 64, DESC_F_WRITE)]);
        assert!(t.can_receive());
        t.receive_frames();
        assert_eq!(used(&rx), [(0, HEADER_LEN as u32 + 3)]);
        let mut got = [0u8; HEADER_LEN + 3];
        mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        assert_eq!(&got[..HEADER_LEN], &RECEIVE_HEADER);
        assert_eq!(&got[HEADER_LEN..], b"one");
        assert!(irq.is_high());
        // The second waits in the network, not in the device.
        assert_eq!(wire.to_guest.lock().unwrap().len(), 1);
        assert!(!t.can_receive());
    }

    #[test]
    fn a_frame_larger_than_the_buffer_is_dropped() {
        let mem = guest_memory();
        let wire = Wire::default();
        let (mut t, _, [rx, _]) = live_net(&mem, &wire);
        wire.to_guest.lock().unwrap().push_back(vec![7; 100]);
        add_chain(&rx, 0, &[(DATA, 64, DESC_F_WRITE)]);
        t.receive_frames();
        assert_eq!(used(&rx), [(0, 0)]);
    }
}
