//! Property tests of every device against a hostile guest and a hostile
//! snapshot: whatever the guest writes to the registers, at any offset and
//! width, and whatever it puts in a virtqueue (loops, overlaps, huge
//! lengths, addresses past the end of RAM), the VMM neither panics nor
//! allocates without bound (`crate::allocation_bound` fails a case that
//! holds more than `CASE_ALLOCATION_LIMIT`), a malformed block request gets
//! an error status, and every state the guest reaches saves and restores to
//! an equal one. `hostile_state` feeds restore what no guest reaches.
//!
//! Cases per property, in the normal test run (`cargo test -p provm-vmm
//! fuzz`): `REGISTER_CASES` for each device's register sequences,
//! `CHAIN_CASES` for the virtqueue properties, and those `hostile_state`
//! and `vm::fuzz` state.

pub(crate) mod harness;
pub(crate) mod hostile_state;
mod paravirt;

pub(crate) use harness::{Fixture, Fuzzed, Op};

use crate::memory::GuestMemory;
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress};

use super::cmos::Cmos;
use super::i8042::I8042;
use super::paravirt::Doorbell;
use super::pic::Pic;
use super::pit::Pit;
use super::serial::SerialPort;
use super::virtio::block::{
    VirtioBlock, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use super::virtio::console::{VirtioConsole, MAX_PENDING_OUTPUT, MAX_TRANSMIT_CHAIN};
use super::virtio::mmio::{regs, MmioTransport};
use super::virtio::testing::{
    initialize_rings, transport, write_reg, Rings, DESC_F_NEXT, DESC_F_WRITE,
};
use super::virtio::VirtioDevice;
use crate::allocation_bound::within_allocation_bound;
use harness::{assert_round_trip, block, fuzz_memory, guest_bytes, CheckedDisk, PAYLOAD, RAM};

/// Cases per property; the hardening report counts them.
const REGISTER_CASES: u32 = 2000;
const CHAIN_CASES: u32 = 2000;

/// The guest's accesses to a fresh device (over guest memory holding
/// `memory`, so that the notifies of a driver-like sequence find rings
/// there) leave it in a state that restores; all within the allocation
/// bound.
fn registers_of<D: Fuzzed>(ops: &[Op], memory: &[u8]) {
    let fixture = Fixture::new(memory);
    within_allocation_bound(|| {
        let mut device = D::fresh(&fixture);
        device.guest(&fixture, ops);
        assert_round_trip(&device, &mut D::fresh(&fixture));
    });
}

/// Strategies of one device's accesses, and of guest memory.
fn accesses<D: Fuzzed>() -> impl Strategy<Value = (Vec<Op>, Vec<u8>)> {
    (D::ops(), guest_bytes())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(REGISTER_CASES))]

    #[test]
    fn pic_survives_any_register_sequence((ops, memory) in accesses::<Pic>()) {
        registers_of::<Pic>(&ops, &memory);
    }

    #[test]
    fn pit_survives_any_register_sequence((ops, memory) in accesses::<Pit>()) {
        registers_of::<Pit>(&ops, &memory);
    }

    #[test]
    fn cmos_survives_any_register_sequence((ops, memory) in accesses::<Cmos>()) {
        registers_of::<Cmos>(&ops, &memory);
    }

    #[test]
    fn serial_survives_any_register_sequence((ops, memory) in accesses::<SerialPort>()) {
        registers_of::<SerialPort>(&ops, &memory);
    }

    #[test]
    fn i8042_survives_any_register_sequence((ops, memory) in accesses::<I8042>()) {
        registers_of::<I8042>(&ops, &memory);
    }

    #[test]
    fn doorbell_survives_any_register_sequence((ops, memory) in accesses::<Doorbell>()) {
        registers_of::<Doorbell>(&ops, &memory);
    }

    #[test]
    fn virtio_block_transport_survives_any_register_sequence(
        (ops, memory) in accesses::<MmioTransport<VirtioBlock>>(),
    ) {
        registers_of::<MmioTransport<VirtioBlock>>(&ops, &memory);
    }

    #[test]
    fn virtio_console_transport_survives_any_register_sequence(
        (ops, memory) in accesses::<MmioTransport<VirtioConsole>>(),
    ) {
        registers_of::<MmioTransport<VirtioConsole>>(&ops, &memory);
    }
}

/// The chain properties' rings, at fixed places below `PAYLOAD`; most
/// descriptors point at the random bytes from there on.
const DESC_TABLE: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// Fits the console's queues (8) and the block device's (256).
const RING: u16 = 8;

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
    fn live<D: VirtioDevice>(&self, device: D) -> (GuestMemory, MmioTransport<D>) {
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
fn used_count(mem: &GuestMemory) -> u16 {
    mem.read_obj(GuestAddress(USED + 2)).unwrap()
}

/// The used ring's entries, as (head, len).
fn used_entries(mem: &GuestMemory) -> Vec<(u32, u32)> {
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
        within_allocation_bound(|| {
            let (mem, mut t) = chains.live(block());
            write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
            write_reg(&mut t, regs::QUEUE_NOTIFY, 0);
            for (head, _) in used_entries(&mem) {
                prop_assert!(head < u32::from(RING), "returned head {head}");
            }
            Ok(())
        })?;
    }

    #[test]
    fn virtio_console_survives_any_descriptor_chains(
        chains in chains(),
        host_bytes in guest_bytes(),
    ) {
        within_allocation_bound(|| {
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
            Ok(())
        })?;
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
        within_allocation_bound(|| write_reg(&mut t, regs::QUEUE_NOTIFY, 0));
        let status: u8 = mem.read_obj(GuestAddress(STATUS)).unwrap();
        let (expected_status, expected_len) = request.expected();
        prop_assert_eq!(used_entries(&mem), vec![(0, expected_len)]);
        prop_assert_eq!(status, expected_status);
    }
}
