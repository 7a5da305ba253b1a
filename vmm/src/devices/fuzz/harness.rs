//! What every fuzz target drives a device with: guest register accesses
//! (`Op`), the host's events between them, and a fixture (clock, guest
//! memory) to build the device in. `Fuzzed` puts each device behind one
//! interface, so that the register, hostile-state and VM-state targets
//! treat them all alike.

use std::fmt::Debug;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::memory::GuestMemory;
use proptest::prelude::*;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use crate::bus::{Bus, BusDevice, SharedDevice};
use crate::clock::Clock;
use crate::devices::cmos::Cmos;
use crate::devices::i8042::{self, I8042};
use crate::devices::paravirt::{Doorbell, DOORBELL_PORT_LEN};
use crate::devices::persist::Persist;
use crate::devices::pic::{self, Pic, PicIrqLine};
use crate::devices::pit::Pit;
use crate::devices::serial::{ConsoleTail, SerialPort};
use crate::devices::virtio::block::{VirtioBlock, CHUNK};
use crate::devices::virtio::console::VirtioConsole;
use crate::devices::virtio::mmio::{regs, MmioTransport};
use crate::devices::virtio::testing::transport;
use crate::devices::IrqLine;
use crate::disk::Disk;

/// One guest register access, or (`Event`) something the host does
/// between two: a line change, time passing, an interrupt acknowledged.
#[derive(Clone, Debug)]
pub(crate) enum Op {
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
pub(crate) fn ops(range: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(range), 0..64)
}

/// An operation at an offset below `range`, of any width.
fn op(range: u64) -> impl Strategy<Value = Op> {
    let width = prop::sample::select(vec![1usize, 2, 4, 8]);
    prop_oneof![
        (0..range, width.clone()).prop_map(|(offset, width)| Op::Read { offset, width }),
        (0..range, width, any::<u64>()).prop_map(|(offset, width, value)| Op::Write {
            offset,
            width,
            value
        }),
        any::<u32>().prop_map(Op::Event),
    ]
}

/// `ops` with each access moved into a device's `registers`.
pub(crate) fn confined(ops: &[Op], registers: u64) -> Vec<Op> {
    let confine = |offset: u64| offset % registers;
    ops.iter()
        .map(|op| match *op {
            Op::Read { offset, width } => Op::Read {
                offset: confine(offset),
                width,
            },
            Op::Write {
                offset,
                width,
                value,
            } => Op::Write {
                offset: confine(offset),
                width,
                value,
            },
            Op::Event(value) => Op::Event(value),
        })
        .collect()
}

/// Performs each access on `device`, and hands each event to `event`.
pub(crate) fn run<D: BusDevice>(ops: &[Op], device: &mut D, mut event: impl FnMut(&mut D, u32)) {
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

/// What `device` is in must restore into `fresh`, to an equal state:
/// validation refuses only states no guest reaches.
pub(crate) fn assert_round_trip<P: Persist>(device: &P, fresh: &mut P)
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
pub(crate) struct StepClock(AtomicU64);

impl StepClock {
    pub(crate) fn advance(&self, ns: u32) -> u64 {
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
pub(crate) struct CheckedDisk(Vec<u8>);

impl CheckedDisk {
    /// Larger than the device's chunk, so that requests can be too.
    pub(crate) const SECTORS: u64 = 256;

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

pub(crate) fn block() -> VirtioBlock {
    VirtioBlock::new(Box::new(CheckedDisk::new()), false)
}

/// Guest RAM of the small fixture: room for rings and the bytes behind
/// them, and small enough that random addresses often land in it.
pub(crate) const RAM: u64 = 0x2_0000;
/// Where the small fixture's random bytes begin.
pub(crate) const PAYLOAD: u64 = 0x3000;

pub(crate) fn guest_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..4096)
}

/// `RAM` bytes of guest memory, `payload` at `PAYLOAD`.
pub(crate) fn fuzz_memory(payload: &[u8]) -> GuestMemory {
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    mem.write_slice(payload, GuestAddress(PAYLOAD)).unwrap();
    mem
}

/// What devices are built with: the clock they read and the guest memory
/// their queues and flags live in.
pub(crate) struct Fixture {
    pub(crate) clock: Arc<StepClock>,
    pub(crate) mem: GuestMemory,
}

impl Fixture {
    /// Over `fuzz_memory(payload)`.
    pub(crate) fn new(payload: &[u8]) -> Self {
        Self::over(fuzz_memory(payload))
    }

    pub(crate) fn over(mem: GuestMemory) -> Self {
        Self {
            clock: Arc::default(),
            mem,
        }
    }

    fn ram_bytes(&self) -> u64 {
        self.mem.last_addr().raw_value() + 1
    }
}

/// A device as the fuzz targets drive it.
pub(crate) trait Fuzzed: Persist<State: Clone + PartialEq + Debug> + Sized {
    /// The accesses' offsets are below this.
    const REGISTERS: u64;

    /// The guest's accesses the targets try.
    fn ops() -> BoxedStrategy<Vec<Op>> {
        ops(Self::REGISTERS).boxed()
    }

    /// The device as the VM builds it, before the guest touches it.
    fn fresh(fixture: &Fixture) -> Self;

    /// The guest's accesses, and the host's events between them.
    fn guest(&mut self, fixture: &Fixture, ops: &[Op]);
}

/// Runs `ops` on `device` through the port bus at `ports`, wiring it there
/// as `pio_devices` does, and hands each event to `event`.
fn on_ports<T: Clone, const N: usize>(
    device: &mut T,
    pio_devices: impl Fn(&Arc<Mutex<T>>) -> [(u64, u64, SharedDevice); N],
    ports: &[u64],
    ops: &[Op],
    mut event: impl FnMut(&Arc<Mutex<T>>, u32),
) {
    let shared = Arc::new(Mutex::new(device.clone()));
    let mut bus = Bus::default();
    for (base, len, device) in pio_devices(&shared) {
        bus.insert(base, len, device).unwrap();
    }
    let mut ports = Ports { bus: &bus, ports };
    run(ops, &mut ports, |_, value| event(&shared, value));
    *device = shared.lock().unwrap().clone();
}

impl Fuzzed for Pic {
    const REGISTERS: u64 = 6;

    fn fresh(_: &Fixture) -> Self {
        Pic::new()
    }

    fn guest(&mut self, _: &Fixture, ops: &[Op]) {
        let mut lines = Vec::new();
        on_ports(
            self,
            pic::pio_devices,
            &[0x20, 0x21, 0xa0, 0xa1, 0x4d0, 0x4d1],
            ops,
            |pic, event| {
                if lines.is_empty() {
                    lines = (0..16)
                        .filter(|&irq| irq != 2)
                        .map(|irq| PicIrqLine::new(pic.clone(), irq))
                        .collect();
                }
                // Line, level, and whether the vCPU then takes an interrupt.
                lines[event as usize % lines.len()].set_level(event & 0x100 != 0);
                if event & 0x200 != 0 {
                    pic.lock().unwrap().acknowledge();
                }
            },
        );
    }
}

impl Fuzzed for I8042 {
    const REGISTERS: u64 = 2;

    fn fresh(_: &Fixture) -> Self {
        I8042::new()
    }

    fn guest(&mut self, _: &Fixture, ops: &[Op]) {
        on_ports(self, i8042::pio_devices, &[0x60, 0x64], ops, |i8042, _| {
            i8042.lock().unwrap().take_reset_request();
        });
    }
}

impl Fuzzed for Pit {
    const REGISTERS: u64 = 4;

    fn fresh(fixture: &Fixture) -> Self {
        Pit::new(fixture.clock.clone())
    }

    /// Time passes, and the vCPU loop polls for ticks as it does at exits.
    fn guest(&mut self, fixture: &Fixture, ops: &[Op]) {
        run(ops, self, |pit, ns| {
            pit.poll(fixture.clock.advance(ns));
            pit.next_deadline_ns();
        });
    }
}

impl Fuzzed for Cmos {
    const REGISTERS: u64 = 2;

    fn fresh(fixture: &Fixture) -> Self {
        Cmos::new(fixture.clock.clone())
    }

    fn guest(&mut self, fixture: &Fixture, ops: &[Op]) {
        run(ops, self, |_, ns| {
            fixture.clock.advance(ns);
        });
    }
}

impl Fuzzed for SerialPort {
    const REGISTERS: u64 = 8;

    fn fresh(_: &Fixture) -> Self {
        SerialPort::new(Arc::new(NoIrq), ConsoleTail::default(), false)
    }

    fn guest(&mut self, _: &Fixture, ops: &[Op]) {
        run(ops, self, |_, _| {});
    }
}

impl Fuzzed for Doorbell {
    const REGISTERS: u64 = DOORBELL_PORT_LEN;

    fn fresh(fixture: &Fixture) -> Self {
        Doorbell::new(fixture.ram_bytes())
    }

    /// The VMM sets the flag the guest named, as it does when an interrupt
    /// waits: it must lie in guest memory.
    fn guest(&mut self, fixture: &Fixture, ops: &[Op]) {
        run(ops, self, |doorbell, _| {
            if let Some(flag) = doorbell.flag() {
                fixture.mem.write_obj(1u8, GuestAddress(flag)).unwrap();
            }
        });
    }
}

/// The transport's register window.
const MMIO_REGISTERS: u64 = 0x200;

/// Accesses to a virtio-mmio transport as a driver makes them, now and
/// then wrong: its registers, 4 bytes wide, with status bits, queue sizes
/// and indices, and addresses in the small fixture's RAM, among any
/// access. Blind accesses rarely get a device live.
pub(crate) fn driver_ops() -> BoxedStrategy<Vec<Op>> {
    let register = prop::sample::select(vec![
        regs::DEVICE_FEATURES_SEL,
        regs::DRIVER_FEATURES,
        regs::DRIVER_FEATURES_SEL,
        regs::QUEUE_SEL,
        regs::QUEUE_NUM,
        regs::QUEUE_READY,
        regs::QUEUE_NOTIFY,
        regs::INTERRUPT_ACK,
        regs::STATUS,
        regs::QUEUE_DESC_LOW,
        regs::QUEUE_DESC_HIGH,
        regs::QUEUE_DRIVER_LOW,
        regs::QUEUE_DRIVER_HIGH,
        regs::QUEUE_DEVICE_LOW,
        regs::QUEUE_DEVICE_HIGH,
        regs::CONFIG,
    ]);
    let value = prop_oneof![
        3 => 0u64..16,
        1 => prop::sample::select(vec![0x100u64, 0x8000, 0x1_0000, u64::from(u32::MAX)]),
        2 => 0..RAM,
        1 => any::<u64>(),
    ];
    let driver = (register, value).prop_map(|(offset, value)| Op::Write {
        offset,
        width: 4,
        value,
    });
    let op = prop_oneof![
        3 => driver,
        1 => op(MMIO_REGISTERS),
    ];
    (any::<bool>(), prop::collection::vec(op, 0..64))
        .prop_map(|(initialized, ops)| {
            let prelude = if initialized { driver_init() } else { vec![] };
            prelude.into_iter().chain(ops).collect()
        })
        .boxed()
}

/// A driver's initialisation (virtio 1.1 §3.1.1) of two queues of 8 with
/// rings among the fixture's random bytes, as register writes: what the
/// accesses after it (and a snapshot's damage) start from.
fn driver_init() -> Vec<Op> {
    use regs::*;
    let write = |offset, value| Op::Write {
        offset,
        width: 4,
        value,
    };
    let status = |bits| write(STATUS, u64::from(bits));
    let mut ops = vec![
        status(0),
        status(ACKNOWLEDGE),
        status(ACKNOWLEDGE | DRIVER),
        // VIRTIO_F_VERSION_1, bit 32, alone.
        write(DRIVER_FEATURES_SEL, 1),
        write(DRIVER_FEATURES, 1),
        status(ACKNOWLEDGE | DRIVER | FEATURES_OK),
    ];
    for queue in 0..2 {
        let rings = PAYLOAD + queue * 0x800;
        ops.extend([
            write(QUEUE_SEL, queue),
            write(QUEUE_NUM, 8),
            write(QUEUE_DESC_LOW, rings),
            write(QUEUE_DRIVER_LOW, rings + 0x400),
            write(QUEUE_DEVICE_LOW, rings + 0x600),
            write(QUEUE_READY, 1),
        ]);
    }
    ops.push(status(ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK));
    ops
}

impl Fuzzed for MmioTransport<VirtioBlock> {
    const REGISTERS: u64 = MMIO_REGISTERS;

    fn ops() -> BoxedStrategy<Vec<Op>> {
        driver_ops()
    }

    fn fresh(fixture: &Fixture) -> Self {
        transport(block(), &fixture.mem).0
    }

    fn guest(&mut self, _: &Fixture, ops: &[Op]) {
        run(ops, self, |_, _| {});
    }
}

impl Fuzzed for MmioTransport<VirtioConsole> {
    const REGISTERS: u64 = MMIO_REGISTERS;

    fn ops() -> BoxedStrategy<Vec<Op>> {
        driver_ops()
    }

    fn fresh(fixture: &Fixture) -> Self {
        transport(VirtioConsole::new(), &fixture.mem).0
    }

    /// The host sends the guest bytes, or takes what it transmitted.
    fn guest(&mut self, _: &Fixture, ops: &[Op]) {
        run(ops, self, |console, event| {
            if event & 1 == 0 {
                console.send_to_guest(&event.to_le_bytes());
            } else {
                console.take_from_guest();
            }
        });
    }
}

/// The prelude gets both devices live, or the targets starting from it
/// would test far less than they claim.
#[test]
fn fuzz_driver_init_gets_both_transports_live() {
    use crate::devices::virtio::testing::read_reg;
    let live = regs::ACKNOWLEDGE | regs::DRIVER | regs::FEATURES_OK | regs::DRIVER_OK;
    let fixture = Fixture::new(&[]);
    let mut block = MmioTransport::<VirtioBlock>::fresh(&fixture);
    block.guest(&fixture, &driver_init());
    assert_eq!(read_reg(&mut block, regs::STATUS), live);
    let mut console = MmioTransport::<VirtioConsole>::fresh(&fixture);
    console.guest(&fixture, &driver_init());
    assert_eq!(read_reg(&mut console, regs::STATUS), live);
}
