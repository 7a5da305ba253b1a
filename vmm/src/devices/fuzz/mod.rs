//! Property tests of every device against a hostile guest: whatever it
//! writes to the registers, at any offset and width, and whatever it puts
//! in a virtqueue (loops, overlaps, huge lengths, addresses past the end of
//! RAM), the VMM neither panics nor allocates without bound, a malformed
//! block request gets an error status, and every state the guest reaches
//! saves and restores to an equal one.

use std::fmt::Debug;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::cmos::Cmos;
use super::i8042::{self, I8042};
use super::persist::Persist;
use super::pic::{self, Pic, PicIrqLine};
use super::pit::Pit;
use super::serial::{ConsoleTail, SerialPort};
use super::virtio::block::{
    VirtioBlock, CHUNK, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use super::virtio::console::{VirtioConsole, MAX_PENDING_OUTPUT, MAX_TRANSMIT_CHAIN};
use super::virtio::mmio::{regs, MmioTransport};
use super::virtio::testing::{
    initialize_rings, transport, write_reg, Rings, DESC_F_NEXT, DESC_F_WRITE,
};
use super::virtio::VirtioDevice;
use super::IrqLine;
use crate::bus::{Bus, BusDevice};
use crate::clock::Clock;
use crate::disk::Disk;

/// Cases per property; the hardening report counts them.
const REGISTER_CASES: u32 = 2000;
const CHAIN_CASES: u32 = 2000;

/// One guest register access, or (`Event`) something the host does
/// between two: a line change, time passing, an interrupt acknowledged.
#[derive(Clone, Debug)]
enum Op {
    Read {
        offset: u64,
        width: usize,
    },
    Write {
        offset: u64,
        width: usize,
        value: u64,
    },
    Event(u32),
}

/// Up to 64 operations at offsets below `range`, of every width.
fn ops(range: u64) -> impl Strategy<Value = Vec<Op>> {
    let width = prop::sample::select(vec![1usize, 2, 4, 8]);
    let op = prop_oneof![
        (0..range, width.clone()).prop_map(|(offset, width)| Op::Read { offset, width }),
        (0..range, width, any::<u64>()).prop_map(|(offset, width, value)| Op::Write {
            offset,
            width,
            value
        }),
        any::<u32>().prop_map(Op::Event),
    ];
    prop::collection::vec(op, 0..64)
}

/// Performs each access on `device`, and hands each event to `event`.
fn run<D: BusDevice>(ops: &[Op], device: &mut D, mut event: impl FnMut(&mut D, u32)) {
    for op in ops {
        match *op {
            Op::Read { offset, width } => device.read(offset, &mut [0; 8][..width]),
            Op::Write {
                offset,
                width,
                value,
            } => device.write(offset, &value.to_le_bytes()[..width]),
            Op::Event(value) => event(device, value),
        }
    }
}

/// Ports of a bus, numbered from 0 for `ops`.
struct Ports<'a> {
    bus: &'a Bus,
    ports: &'a [u64],
}

impl BusDevice for Ports<'_> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.bus.read(self.ports[offset as usize], data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.bus.write(self.ports[offset as usize], data);
    }
}

/// What the guest left `device` in must restore into `fresh`, to an equal
/// state: validation refuses only states no guest reaches.
fn assert_round_trip<P: Persist>(device: &P, fresh: &mut P)
where
    P::State: PartialEq + Debug,
{
    let saved = device.save();
    if let Err(error) = fresh.restore(&saved) {
        panic!("a state the guest reached was refused: {error}");
    }
    assert_eq!(fresh.save(), saved);
}

/// Time set by the test, for both clocks.
#[derive(Default)]
struct StepClock(AtomicU64);

impl StepClock {
    fn advance(&self, ns: u32) -> u64 {
        self.0.fetch_add(u64::from(ns), Ordering::SeqCst) + u64::from(ns)
    }
}

impl Clock for StepClock {
    fn monotonic_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    fn wall_ns(&self) -> u64 {
        self.monotonic_ns()
    }
}

struct NoIrq;

impl IrqLine for NoIrq {
    fn set_level(&self, _high: bool) {}
}

/// A disk that fails the test if the device hands it a buffer larger than
/// the device's chunk (a guest-sized allocation) or an access past its end.
struct CheckedDisk(Vec<u8>);

impl CheckedDisk {
    /// Larger than the device's chunk, so that requests can be too.
    const SECTORS: u64 = 256;

    fn new() -> Self {
        Self(vec![0x5a; Self::SECTORS as usize * 512])
    }

    fn range(&self, offset: u64, len: usize) -> std::ops::Range<usize> {
        assert!(len <= CHUNK, "device buffer of {len} bytes");
        let start = usize::try_from(offset).unwrap();
        assert!(start + len <= self.0.len(), "access past the disk's end");
        start..start + len
    }
}

impl Disk for CheckedDisk {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let range = self.range(offset, buf.len());
        buf.copy_from_slice(&self.0[range]);
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let range = self.range(offset, buf.len());
        self.0[range].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn block() -> VirtioBlock {
    VirtioBlock::new(Box::new(CheckedDisk::new()), false)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(REGISTER_CASES))]

    #[test]
    fn pic_survives_any_register_sequence(ops in ops(6)) {
        let pic = Arc::new(Mutex::new(Pic::new()));
        let mut bus = Bus::default();
        for (base, len, device) in pic::pio_devices(&pic) {
            bus.insert(base, len, device).unwrap();
        }
        let lines: Vec<PicIrqLine> = (0..16)
            .filter(|&irq| irq != 2)
            .map(|irq| PicIrqLine::new(pic.clone(), irq))
            .collect();
        let ports = [0x20, 0x21, 0xa0, 0xa1, 0x4d0, 0x4d1];
        let mut ports = Ports { bus: &bus, ports: &ports };
        run(
            &ops,
            &mut ports,
            |_, event| {
                // Line, level, and whether the vCPU then takes an interrupt.
                lines[event as usize % lines.len()].set_level(event & 0x100 != 0);
                if event & 0x200 != 0 {
                    pic.lock().unwrap().acknowledge();
                }
            },
        );
        assert_round_trip(&*pic.lock().unwrap(), &mut Pic::new());
    }

    #[test]
    fn pit_survives_any_register_sequence(ops in ops(4)) {
        let clock = Arc::new(StepClock::default());
        let mut pit = Pit::new(clock.clone());
        // Time passes, and the vCPU loop polls for ticks as it does at exits.
        run(&ops, &mut pit, |pit, ns| {
            pit.poll(clock.advance(ns));
            pit.next_deadline_ns();
        });
        assert_round_trip(&pit, &mut Pit::new(clock));
    }

    #[test]
    fn cmos_survives_any_register_sequence(ops in ops(2)) {
        let clock = Arc::new(StepClock::default());
        let mut cmos = Cmos::new(clock.clone());
        run(&ops, &mut cmos, |_, ns| {
            clock.advance(ns);
        });
        assert_round_trip(&cmos, &mut Cmos::new(clock));
    }

    #[test]
    fn serial_survives_any_register_sequence(ops in ops(8)) {
        let serial = || SerialPort::new(Arc::new(NoIrq), ConsoleTail::default(), false);
        let mut port = serial();
        run(&ops, &mut port, |_, _| {});
        assert_round_trip(&port, &mut serial());
    }

    #[test]
    fn i8042_survives_any_register_sequence(ops in ops(2)) {
        let i8042 = Arc::new(Mutex::new(I8042::new()));
        let mut bus = Bus::default();
        for (base, len, device) in i8042::pio_devices(&i8042) {
            bus.insert(base, len, device).unwrap();
        }
        let mut ports = Ports { bus: &bus, ports: &[0x60, 0x64] };
        run(&ops, &mut ports, |_, _| {
            i8042.lock().unwrap().take_reset_request();
        });
        assert_round_trip(&*i8042.lock().unwrap(), &mut I8042::new());
    }

    #[test]
    fn virtio_block_transport_survives_any_register_sequence(
        ops in ops(0x200),
        memory in guest_bytes(),
    ) {
        registers_of(block, &ops, &memory);
    }

    #[test]
    fn virtio_console_transport_survives_any_register_sequence(
        ops in ops(0x200),
        memory in guest_bytes(),
    ) {
        registers_of(VirtioConsole::new, &ops, &memory);
    }
}

/// Register accesses to a transport over guest memory holding `memory`,
/// so that the notifies a driver-like sequence reaches find rings there.
fn registers_of<D: VirtioDevice>(device: impl Fn() -> D, ops: &[Op], memory: &[u8])
where
    D::State: PartialEq + Debug,
{
    let mem = fuzz_memory(memory);
    let (mut t, _) = transport(device(), &mem);
    run(ops, &mut t, |_, _| {});
    let (mut fresh, _) = transport(device(), &mem);
    assert_round_trip(&t, &mut fresh);
}

/// Guest RAM for the chain properties: rings at fixed places, random bytes
/// from PAYLOAD on, where most descriptors point.
const RAM: u64 = 0x2_0000;
const DESC_TABLE: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const PAYLOAD: u64 = 0x3000;
/// Fits the console's queues (8) and the block device's (256).
const RING: u16 = 8;

fn guest_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..4096)
}

fn fuzz_memory(payload: &[u8]) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    mem.write_slice(payload, GuestAddress(PAYLOAD)).unwrap();
    mem
}

/// A descriptor as the driver writes it (virtio 1.1 §2.6.5).
#[derive(Clone, Debug)]
struct RawDesc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

fn raw_desc() -> impl Strategy<Value = RawDesc> {
    let addr = prop_oneof![
        4 => PAYLOAD..RAM,
        2 => Just(PAYLOAD),
        1 => (RAM - 64)..(RAM + 64),
        1 => Just(u64::MAX - 7),
        1 => any::<u64>(),
    ];
    let len = prop_oneof![
        4 => 0u32..64,
        2 => 0u32..0x2000,
        2 => 0u32..(RAM - PAYLOAD) as u32,
        1 => (RAM as u32 - 16)..(RAM as u32 + 16),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ];
    // NEXT, WRITE and INDIRECT in any mix; `next` past the ring now and then.
    (addr, len, 0u16..8, 0..RING + 2).prop_map(|(addr, len, flags, next)| RawDesc {
        addr,
        len,
        flags,
        next,
    })
}

/// A driver's queue gone wrong: a descriptor table, chain heads made
/// available (any index, any count), and the bytes behind them.
#[derive(Clone, Debug)]
struct Chains {
    table: Vec<RawDesc>,
    heads: Vec<u16>,
    /// The avail ring's index: how many heads the driver claims it posted.
    avail_idx: u16,
    payload: Vec<u8>,
}

fn chains() -> impl Strategy<Value = Chains> {
    (
        prop::collection::vec(raw_desc(), RING as usize),
        prop::collection::vec(0..RING + 2, RING as usize),
        prop_oneof![4 => 0..=RING, 1 => any::<u16>()],
        guest_bytes(),
    )
        .prop_map(|(table, heads, avail_idx, payload)| Chains {
            table,
            heads,
            avail_idx,
            payload,
        })
}

impl Chains {
    /// Guest memory holding the queue, and a transport over it whose
    /// queues all use these rings (a hostile driver may share them).
    fn live<D: VirtioDevice>(&self, device: D) -> (GuestMemoryMmap, MmioTransport<D>) {
        let mem = fuzz_memory(&self.payload);
        for (i, desc) in self.table.iter().enumerate() {
            let at = GuestAddress(DESC_TABLE + 16 * i as u64);
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&desc.addr.to_le_bytes());
            bytes[8..12].copy_from_slice(&desc.len.to_le_bytes());
            bytes[12..14].copy_from_slice(&desc.flags.to_le_bytes());
            bytes[14..].copy_from_slice(&desc.next.to_le_bytes());
            mem.write_slice(&bytes, at).unwrap();
        }
        mem.write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        for (i, head) in self.heads.iter().enumerate() {
            mem.write_obj(*head, GuestAddress(AVAIL + 4 + 2 * i as u64))
                .unwrap();
        }
        let rings: Vec<Rings> = device
            .queue_max_sizes()
            .iter()
            .map(|_| Rings {
                size: RING,
                desc_table: DESC_TABLE,
                avail: AVAIL,
                used: USED,
            })
            .collect();
        let (mut t, _) = transport(device, &mem);
        initialize_rings(&mut t, &rings);
        (mem, t)
    }
}

/// How many chains the device has returned: the used ring's index.
fn used_count(mem: &GuestMemoryMmap) -> u16 {
    mem.read_obj(GuestAddress(USED + 2)).unwrap()
}

/// The used ring's entries, as (head, len).
fn used_entries(mem: &GuestMemoryMmap) -> Vec<(u32, u32)> {
    (0..u64::from(used_count(mem).min(RING)))
        .map(|i| {
            let at = USED + 4 + 8 * i;
            (
                mem.read_obj(GuestAddress(at)).unwrap(),
                mem.read_obj(GuestAddress(at + 4)).unwrap(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CHAIN_CASES))]

    #[test]
    fn virtio_block_survives_any_descriptor_chains(chains in chains()) {
        // CheckedDisk fails the case on a guest-sized buffer or an access
        // past the disk's end.
        let (mem, mut t) = chains.live(block());
        write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
        for (head, _) in used_entries(&mem) {
            prop_assert!(head < u32::from(RING), "returned head {head}");
        }
    }

    #[test]
    fn virtio_console_survives_any_descriptor_chains(
        chains in chains(),
        host_bytes in guest_bytes(),
    ) {
        let (mem, mut t) = chains.live(VirtioConsole::new());
        t.send_to_guest(&host_bytes);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 1);
        write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
        let output = t.take_from_guest().len();
        let returned = usize::from(used_count(&mem));
        prop_assert!(output <= MAX_PENDING_OUTPUT, "{output} bytes held");
        prop_assert!(
            output <= returned * MAX_TRANSMIT_CHAIN,
            "{output} bytes from {returned} chains"
        );
        for (head, _) in used_entries(&mem) {
            prop_assert!(head < u32::from(RING), "returned head {head}");
        }
    }
}

/// A block request in a well-formed chain (header, data segments, status
/// byte), whose fields may make no sense.
#[derive(Clone, Debug)]
struct Request {
    request_type: u32,
    sector: u64,
    /// Lengths of the data descriptors, all at DATA: they overlap.
    segments: Vec<u32>,
    device_writable: bool,
}

const HEADER: u64 = PAYLOAD;
const STATUS: u64 = PAYLOAD + 0x100;
const DATA: u64 = PAYLOAD + 0x1000;

fn request() -> impl Strategy<Value = Request> {
    let request_type = prop_oneof![
        Just(VIRTIO_BLK_T_IN),
        Just(VIRTIO_BLK_T_OUT),
        Just(VIRTIO_BLK_T_FLUSH),
        Just(VIRTIO_BLK_T_GET_ID),
        any::<u32>(),
    ];
    let sector = prop_oneof![
        3 => 0..CheckedDisk::SECTORS + 4,
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ];
    let segment = prop_oneof![0u32..2048, (0u32..=128).prop_map(|sectors| 512 * sectors),];
    (
        request_type,
        sector,
        prop::collection::vec(segment, 0..=3),
        any::<bool>(),
    )
        .prop_map(
            |(request_type, sector, segments, device_writable)| Request {
                request_type,
                sector,
                segments,
                device_writable,
            },
        )
}

impl Request {
    /// The request as the only chain of a queue.
    fn chains(&self) -> Chains {
        let data_flags = if self.device_writable {
            DESC_F_WRITE
        } else {
            0
        };
        let descs: Vec<(u64, u32, u16)> = std::iter::once((HEADER, 16, 0))
            .chain(self.segments.iter().map(|&len| (DATA, len, data_flags)))
            .chain(std::iter::once((STATUS, 1, DESC_F_WRITE)))
            .collect();
        let last = descs.len() - 1;
        let table = descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| RawDesc {
                addr,
                len,
                flags: if i == last {
                    flags
                } else {
                    flags | DESC_F_NEXT
                },
                next: i as u16 + 1,
            })
            .collect();
        let mut payload = vec![0u8; 0x101];
        payload[..4].copy_from_slice(&self.request_type.to_le_bytes());
        payload[8..16].copy_from_slice(&self.sector.to_le_bytes());
        payload[0x100] = 0xff;
        Chains {
            table,
            heads: vec![0],
            avail_idx: 1,
            payload,
        }
    }

    /// The status virtio 1.1 §5.2.6 asks for, and the used length.
    fn expected(&self) -> (u8, u32) {
        let len: u64 = self.segments.iter().map(|&l| u64::from(l)).sum();
        let (readable, writable) = if self.device_writable {
            (0, len)
        } else {
            (len, 0)
        };
        let in_disk = len.is_multiple_of(512)
            && self
                .sector
                .checked_add(len / 512)
                .is_some_and(|end| end <= CheckedDisk::SECTORS);
        let (ok, written) = match self.request_type {
            VIRTIO_BLK_T_IN => (readable == 0 && in_disk, writable),
            VIRTIO_BLK_T_OUT => (writable == 0 && in_disk, 0),
            VIRTIO_BLK_T_FLUSH => (len == 0, 0),
            VIRTIO_BLK_T_GET_ID => (true, writable.min(20)),
            _ => return (VIRTIO_BLK_S_UNSUPP, 1),
        };
        match ok {
            true => (VIRTIO_BLK_S_OK, written as u32 + 1),
            false => (VIRTIO_BLK_S_IOERR, 1),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CHAIN_CASES))]

    #[test]
    fn virtio_block_answers_each_request_with_its_status(request in request()) {
        let (mem, mut t) = request.chains().live(block());
        write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
        let status: u8 = mem.read_obj(GuestAddress(STATUS)).unwrap();
        let (expected_status, expected_len) = request.expected();
        prop_assert_eq!(used_entries(&mem), vec![(0, expected_len)]);
        prop_assert_eq!(status, expected_status);
    }
}
