//! The event log: everything that crossed the seam, in order, in a compact
//! binary encoding (a tag byte, then varints and bytes). The VM exit count
//! is implicit: it is the number of exit events before a position. Each
//! exit carries the guest's place: its RIP, as the zigzag varint of the
//! difference from the previous exit's (exits cluster in a few kernel
//! functions), and its registers' 8-byte digest.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::hex;

/// Where the guest was at a VM exit: its instruction pointer and a digest
/// of its general registers, RIP and RFLAGS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub rip: u64,
    pub registers: u64,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at RIP {:#x}, registers {:016x}",
            self.rip, self.registers
        )
    }
}

/// One logged crossing of the seam.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    PioRead {
        port: u16,
        len: u16,
        at: Place,
    },
    PioWrite {
        port: u16,
        data: Vec<u8>,
        at: Place,
    },
    MmioRead {
        address: u64,
        len: u8,
        at: Place,
    },
    MmioWrite {
        address: u64,
        data: Vec<u8>,
        at: Place,
    },
    Halt {
        at: Place,
    },
    InterruptWindow {
        at: Place,
    },
    /// RDMSR of an MSR the VMM answers; the value follows as a ReadResult.
    MsrRead {
        index: u32,
        at: Place,
    },
    /// What the device returned for the preceding read exit.
    ReadResult(Vec<u8>),
    /// A reading of the monotonic virtual clock, in nanoseconds.
    Clock(u64),
    /// A reading of the wall clock, in nanoseconds since the Unix epoch.
    Wall(u64),
    Inject(u8),
    AgentInput(Vec<u8>),
    AgentOutput(Vec<u8>),
    /// A disk write: where, how much, and a digest of the bytes (the bytes
    /// themselves follow from the image and the guest, which replay re-runs).
    DiskWrite {
        offset: u64,
        len: u32,
        digest: u64,
    },
    /// A state check: the digest of all guest memory (xxh3-64), taken right
    /// after a VM exit where the recorder chose to (see `provm_vmm::seam::
    /// Seam::memory_check_due`); a replay takes its own at the same event
    /// and compares.
    StateCheck {
        memory: u64,
    },
    /// An Ethernet frame the guest's network card received (`--net`),
    /// whole: an input the replay feeds back.
    NetReceived(Vec<u8>),
    /// A frame the guest's network card sent: its length and a digest,
    /// as for a disk write (the replayed guest sends the bytes again).
    NetSent {
        len: u32,
        digest: u64,
    },
    /// In a guest with more than one vCPU: from here on vCPU n runs (the
    /// serialised schedule, at the exit just before; see
    /// `provm_vmm::scheduler`).
    Switch(u8),
    /// The recorder preempted the guest where it had computed for a
    /// quantum without an exit, to deliver what waited (a kick; see
    /// `provm_vmm::preemption`). The guest stood `at`; `instance` digests
    /// the rest of its state there: its system and vector registers and
    /// the bytes of `pages`, every guest page written since the last
    /// preemption, as runs of page numbers (first, count). A replay runs
    /// the guest to the place and takes the stop whose state digests so.
    /// `ran_ns`: for a computation that may end by itself, how long the
    /// vCPU computed in the guest since its last exit (its thread's CPU
    /// time), which a replay runs freely for in part before it looks
    /// (`EventKind::PreemptedAfter`, format 13); `None` for a loop that
    /// never ends, whose search starts at the last exit. `user_code`:
    /// where the guest stood in user mode, the guest physical address of
    /// the instruction at `at`; `instance` then leaves out the frame of the
    /// kernel's last entry from user mode (`EventKind::PreemptedInUserMode`,
    /// format 14; before, every instance digested it).
    Preempted {
        at: Place,
        pages: Vec<(u64, u64)>,
        instance: u64,
        ran_ns: Option<u64>,
        user_code: Option<u64>,
    },
}

impl Event {
    /// The event of a disk write of `data` at byte `offset`.
    pub fn disk_write(offset: u64, data: &[u8]) -> Event {
        Event::DiskWrite {
            offset,
            len: data.len() as u32,
            digest: short_digest(data),
        }
    }

    /// The event of the guest sending the Ethernet frame `frame`.
    pub fn net_sent(frame: &[u8]) -> Event {
        Event::NetSent {
            len: frame.len() as u32,
            digest: short_digest(frame),
        }
    }

    /// Whether this event is a VM exit (and so advances the exit count).
    pub fn is_exit(&self) -> bool {
        self.kind().is_exit()
    }

    /// Where the guest was, if this is an exit.
    pub fn place(&self) -> Option<Place> {
        match self {
            Event::PioRead { at, .. }
            | Event::PioWrite { at, .. }
            | Event::MmioRead { at, .. }
            | Event::MmioWrite { at, .. }
            | Event::Halt { at }
            | Event::InterruptWindow { at }
            | Event::MsrRead { at, .. }
            | Event::Preempted { at, .. } => Some(*at),
            _ => None,
        }
    }

    pub fn kind(&self) -> EventKind {
        match self {
            Event::PioRead { .. } => EventKind::PioRead,
            Event::PioWrite { .. } => EventKind::PioWrite,
            Event::MmioRead { .. } => EventKind::MmioRead,
            Event::MmioWrite { .. } => EventKind::MmioWrite,
            Event::Halt { .. } => EventKind::Halt,
            Event::InterruptWindow { .. } => EventKind::InterruptWindow,
            Event::MsrRead { .. } => EventKind::MsrRead,
            Event::ReadResult(_) => EventKind::ReadResult,
            Event::Clock(_) => EventKind::Clock,
            Event::Wall(_) => EventKind::Wall,
            Event::Inject(_) => EventKind::Inject,
            Event::AgentInput(_) => EventKind::AgentInput,
            Event::AgentOutput(_) => EventKind::AgentOutput,
            Event::DiskWrite { .. } => EventKind::DiskWrite,
            Event::StateCheck { .. } => EventKind::StateCheck,
            Event::NetReceived(_) => EventKind::NetReceived,
            Event::NetSent { .. } => EventKind::NetSent,
            Event::Switch(_) => EventKind::Switch,
            Event::Preempted {
                user_code: Some(_), ..
            } => EventKind::PreemptedInUserMode,
            Event::Preempted { ran_ns: None, .. } => EventKind::Preempted,
            Event::Preempted {
                ran_ns: Some(_), ..
            } => EventKind::PreemptedAfter,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::PioRead { port, len, at } => {
                write!(f, "port read {port:#x} ({len} bytes) {at}")
            }
            Event::PioWrite { port, data, at } => {
                write!(f, "port write {port:#x} {} {at}", hex(data))
            }
            Event::MmioRead { address, len, at } => {
                write!(f, "MMIO read {address:#x} ({len} bytes) {at}")
            }
            Event::MmioWrite { address, data, at } => {
                write!(f, "MMIO write {address:#x} {} {at}", hex(data))
            }
            Event::Halt { at } => write!(f, "HLT {at}"),
            Event::InterruptWindow { at } => write!(f, "interrupt window {at}"),
            Event::MsrRead { index, at } => write!(f, "RDMSR {index:#x} {at}"),
            Event::ReadResult(data) => write!(f, "read returned {}", hex(data)),
            Event::Clock(ns) => write!(f, "clock {ns} ns"),
            Event::Wall(ns) => write!(f, "wall clock {ns} ns"),
            Event::Inject(vector) => write!(f, "inject vector {vector:#x}"),
            Event::AgentInput(bytes) => write!(f, "agent input ({} bytes)", bytes.len()),
            Event::AgentOutput(bytes) => write!(f, "agent output {}", hex(bytes)),
            Event::DiskWrite {
                offset,
                len,
                digest,
            } => write!(
                f,
                "disk write {len} bytes at {offset} (digest {digest:016x})"
            ),
            Event::StateCheck { memory } => {
                write!(f, "state check: memory digest {memory:016x}")
            }
            Event::NetReceived(frame) => {
                write!(f, "network frame received ({} bytes)", frame.len())
            }
            Event::NetSent { len, digest } => {
                write!(f, "network frame sent, {len} bytes (digest {digest:016x})")
            }
            Event::Switch(cpu) => write!(f, "switch to vCPU {cpu}"),
            Event::Preempted {
                at,
                pages,
                instance,
                ran_ns,
                user_code,
            } => {
                write!(
                    f,
                    "preempted {at}{}, state {instance:016x} over {} written pages",
                    if user_code.is_some() {
                        " in user mode"
                    } else {
                        ""
                    },
                    pages.iter().map(|(_, count)| count).sum::<u64>()
                )?;
                match ran_ns {
                    Some(ns) => write!(f, ", after {ns} ns computing"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Event kinds, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    PioRead = 1,
    PioWrite,
    MmioRead,
    MmioWrite,
    Halt,
    InterruptWindow,
    ReadResult,
    Clock,
    Wall,
    Inject,
    AgentInput,
    AgentOutput,
    DiskWrite,
    MsrRead,
    StateCheck,
    NetReceived,
    NetSent,
    Switch,
    Preempted,
    /// A preemption with the time computed before it (format 13).
    PreemptedAfter,
    /// A preemption in user mode, timed or not (format 14).
    PreemptedInUserMode,
}

impl EventKind {
    const ALL: [EventKind; 21] = [
        EventKind::PioRead,
        EventKind::PioWrite,
        EventKind::MmioRead,
        EventKind::MmioWrite,
        EventKind::Halt,
        EventKind::InterruptWindow,
        EventKind::ReadResult,
        EventKind::Clock,
        EventKind::Wall,
        EventKind::Inject,
        EventKind::AgentInput,
        EventKind::AgentOutput,
        EventKind::DiskWrite,
        EventKind::MsrRead,
        EventKind::StateCheck,
        EventKind::NetReceived,
        EventKind::NetSent,
        EventKind::Switch,
        EventKind::Preempted,
        EventKind::PreemptedAfter,
        EventKind::PreemptedInUserMode,
    ];

    pub fn is_exit(self) -> bool {
        (self as u8) <= EventKind::InterruptWindow as u8
            || self == EventKind::MsrRead
            || self == EventKind::Preempted
            || self == EventKind::PreemptedAfter
            || self == EventKind::PreemptedInUserMode
    }

    pub fn name(self) -> &'static str {
        match self {
            EventKind::PioRead => "port read",
            EventKind::PioWrite => "port write",
            EventKind::MmioRead => "MMIO read",
            EventKind::MmioWrite => "MMIO write",
            EventKind::Halt => "HLT",
            EventKind::InterruptWindow => "interrupt window",
            EventKind::ReadResult => "read result",
            EventKind::Clock => "clock",
            EventKind::Wall => "wall clock",
            EventKind::Inject => "interrupt injection",
            EventKind::AgentInput => "agent input",
            EventKind::AgentOutput => "agent output",
            EventKind::DiskWrite => "disk write",
            EventKind::MsrRead => "RDMSR",
            EventKind::StateCheck => "state check",
            EventKind::NetReceived => "net frame received",
            EventKind::NetSent => "net frame sent",
            EventKind::Switch => "vCPU switch",
            EventKind::Preempted => "preemption",
            EventKind::PreemptedAfter => "timed preemption",
            EventKind::PreemptedInUserMode => "preemption in user mode",
        }
    }

    fn from_tag(tag: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| *kind as u8 == tag)
    }
}

/// Encodes events; clock readings and exits' RIPs are stored as
/// differences from the last.
#[derive(Default)]
pub struct Encoder {
    last_clock: u64,
    last_rip: u64,
}

impl Encoder {
    pub fn encode(&mut self, event: &Event, out: &mut Vec<u8>) {
        out.push(event.kind() as u8);
        if let Some(at) = event.place() {
            put_varint(out, zigzag(at.rip.wrapping_sub(self.last_rip)));
            out.extend_from_slice(&at.registers.to_le_bytes());
            self.last_rip = at.rip;
        }
        match event {
            Event::PioRead { port, len, .. } => {
                out.extend_from_slice(&port.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Event::PioWrite { port, data, .. } => {
                out.extend_from_slice(&port.to_le_bytes());
                put_bytes(out, data);
            }
            Event::MmioRead { address, len, .. } => {
                put_varint(out, *address);
                out.push(*len);
            }
            Event::MmioWrite { address, data, .. } => {
                put_varint(out, *address);
                put_bytes(out, data);
            }
            Event::Halt { .. } | Event::InterruptWindow { .. } => {}
            Event::MsrRead { index, .. } => put_varint(out, u64::from(*index)),
            Event::ReadResult(data)
            | Event::AgentInput(data)
            | Event::AgentOutput(data)
            | Event::NetReceived(data) => put_bytes(out, data),
            Event::Clock(ns) => {
                // The monotonic clock never goes backwards, so the difference
                // is small; the decoder refuses one that would wrap.
                put_varint(out, ns.wrapping_sub(self.last_clock));
                self.last_clock = *ns;
            }
            Event::Wall(ns) => put_varint(out, *ns),
            Event::Inject(vector) | Event::Switch(vector) => out.push(*vector),
            Event::DiskWrite {
                offset,
                len,
                digest,
            } => {
                put_varint(out, *offset);
                put_varint(out, u64::from(*len));
                out.extend_from_slice(&digest.to_le_bytes());
            }
            Event::StateCheck { memory } => out.extend_from_slice(&memory.to_le_bytes()),
            Event::NetSent { len, digest } => {
                put_varint(out, u64::from(*len));
                out.extend_from_slice(&digest.to_le_bytes());
            }
            Event::Preempted {
                pages,
                instance,
                ran_ns,
                user_code,
                ..
            } => {
                // Runs ascend: each as its gap from the last one's end.
                put_varint(out, pages.len() as u64);
                let mut end = 0;
                for &(first, count) in pages {
                    put_varint(out, first.wrapping_sub(end));
                    put_varint(out, count);
                    end = first.wrapping_add(count);
                }
                out.extend_from_slice(&instance.to_le_bytes());
                match (user_code, ran_ns) {
                    // In user mode: 0 for a loop, else 1 + the time; then
                    // the instruction's address.
                    (Some(physical), _) => {
                        put_varint(out, ran_ns.map_or(0, |ns| ns + 1));
                        put_varint(out, *physical);
                    }
                    (None, Some(ns)) => put_varint(out, *ns),
                    (None, None) => {}
                }
            }
        }
    }
}

/// The first 8 bytes of `data`'s SHA-256: what an output event keeps of
/// bytes the replayed guest produces again.
fn short_digest(data: &[u8]) -> u64 {
    u64::from_le_bytes(Sha256::digest(data)[..8].try_into().unwrap())
}

/// A two's-complement difference as a small unsigned number: 0, -1, 1, -2...
fn zigzag(difference: u64) -> u64 {
    (difference << 1) ^ ((difference as i64 >> 63) as u64)
}

fn unzigzag(value: u64) -> u64 {
    (value >> 1) ^ (value & 1).wrapping_neg()
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_bytes(out: &mut Vec<u8>, data: &[u8]) {
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed event at byte {offset} of an event chunk: {what}")]
pub struct DecodeError {
    pub offset: usize,
    pub what: &'static str,
}

/// Decodes what `Encoder` wrote; the state carries across chunks.
#[derive(Default)]
pub struct Decoder {
    last_clock: u64,
    last_rip: u64,
}

impl Decoder {
    /// Decodes every event in `chunk`.
    pub fn decode_all(&mut self, chunk: &[u8]) -> Result<Vec<Event>, DecodeError> {
        let mut input = Input {
            bytes: chunk,
            at: 0,
        };
        let mut events = Vec::new();
        while input.at < chunk.len() {
            events.push(self.decode_one(&mut input)?);
        }
        Ok(events)
    }

    fn decode_one(&mut self, input: &mut Input<'_>) -> Result<Event, DecodeError> {
        let tag = input.byte()?;
        let kind = EventKind::from_tag(tag).ok_or(input.error("unknown event tag"))?;
        // An exit's place comes before its own fields, as `Encoder` wrote
        // it (fields are evaluated in the order they are written).
        Ok(match kind {
            EventKind::PioRead => Event::PioRead {
                at: self.place(input)?,
                port: input.port()?,
                len: u16::from_le_bytes(input.array()?),
            },
            EventKind::PioWrite => Event::PioWrite {
                at: self.place(input)?,
                port: input.port()?,
                data: input.bytes()?,
            },
            EventKind::MmioRead => Event::MmioRead {
                at: self.place(input)?,
                address: input.varint()?,
                len: input.byte()?,
            },
            EventKind::MmioWrite => Event::MmioWrite {
                at: self.place(input)?,
                address: input.varint()?,
                data: input.bytes()?,
            },
            EventKind::Halt => Event::Halt {
                at: self.place(input)?,
            },
            EventKind::InterruptWindow => Event::InterruptWindow {
                at: self.place(input)?,
            },
            EventKind::MsrRead => Event::MsrRead {
                at: self.place(input)?,
                index: u32::try_from(input.varint()?)
                    .map_err(|_| input.error("MSR index out of range"))?,
            },
            EventKind::ReadResult => Event::ReadResult(input.bytes()?),
            EventKind::Clock => {
                let delta = input.varint()?;
                self.last_clock = self
                    .last_clock
                    .checked_add(delta)
                    .ok_or(input.error("clock reading past 2^64 ns"))?;
                Event::Clock(self.last_clock)
            }
            EventKind::Wall => Event::Wall(input.varint()?),
            EventKind::Inject => Event::Inject(input.byte()?),
            EventKind::Switch => Event::Switch(input.byte()?),
            EventKind::AgentInput => Event::AgentInput(input.bytes()?),
            EventKind::AgentOutput => Event::AgentOutput(input.bytes()?),
            EventKind::DiskWrite => Event::DiskWrite {
                offset: input.varint()?,
                len: u32::try_from(input.varint()?)
                    .map_err(|_| input.error("disk write length out of range"))?,
                digest: u64::from_le_bytes(input.array()?),
            },
            EventKind::StateCheck => Event::StateCheck {
                memory: u64::from_le_bytes(input.array()?),
            },
            EventKind::NetReceived => Event::NetReceived(input.bytes()?),
            EventKind::NetSent => Event::NetSent {
                len: u32::try_from(input.varint()?)
                    .map_err(|_| input.error("frame length out of range"))?,
                digest: u64::from_le_bytes(input.array()?),
            },
            EventKind::Preempted => Event::Preempted {
                at: self.place(input)?,
                pages: input.page_runs()?,
                instance: u64::from_le_bytes(input.array()?),
                ran_ns: None,
                user_code: None,
            },
            EventKind::PreemptedAfter => Event::Preempted {
                at: self.place(input)?,
                pages: input.page_runs()?,
                instance: u64::from_le_bytes(input.array()?),
                ran_ns: Some(input.varint()?),
                user_code: None,
            },
            EventKind::PreemptedInUserMode => Event::Preempted {
                at: self.place(input)?,
                pages: input.page_runs()?,
                instance: u64::from_le_bytes(input.array()?),
                ran_ns: input.varint()?.checked_sub(1),
                user_code: Some(input.varint()?),
            },
        })
    }
}

impl Decoder {
    fn place(&mut self, input: &mut Input<'_>) -> Result<Place, DecodeError> {
        self.last_rip = self.last_rip.wrapping_add(unzigzag(input.varint()?));
        Ok(Place {
            rip: self.last_rip,
            registers: u64::from_le_bytes(input.array()?),
        })
    }
}

struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn error(&self, what: &'static str) -> DecodeError {
        DecodeError {
            offset: self.at,
            what,
        }
    }

    fn take(&mut self, len: usize) -> Result<&[u8], DecodeError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(self.error("event runs past the end of its chunk"))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().unwrap())
    }

    fn port(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            // The tenth byte holds bit 63 only: more would be dropped.
            if shift == 63 && byte & 0x7e != 0 {
                return Err(self.error("varint longer than 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.error("varint longer than 64 bits"))
    }

    /// Runs of page numbers as `Encoder` wrote them, ascending.
    fn page_runs(&mut self) -> Result<Vec<(u64, u64)>, DecodeError> {
        let runs = self.varint()?;
        // Each run takes two bytes at least: a count past the chunk's end
        // is malformed, not a reason to reserve memory.
        if runs > (self.bytes.len() - self.at) as u64 / 2 {
            return Err(self.error("more page runs than the chunk holds"));
        }
        let mut pages = Vec::with_capacity(runs as usize);
        let mut end = 0u64;
        for _ in 0..runs {
            let first = end
                .checked_add(self.varint()?)
                .ok_or(self.error("page number past 2^64"))?;
            let count = self.varint()?;
            end = first
                .checked_add(count)
                .ok_or(self.error("page run past 2^64"))?;
            pages.push((first, count));
        }
        Ok(pages)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = usize::try_from(self.varint()?).map_err(|_| self.error("length out of range"))?;
        Ok(self.take(len)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KERNEL: u64 = 0xffff_ffff_8100_0000;

    fn at(rip: u64) -> Place {
        Place {
            rip,
            registers: rip.rotate_left(17) ^ 0x5a5a,
        }
    }

    fn every_kind() -> Vec<Event> {
        vec![
            Event::PioRead {
                port: 0x40,
                len: 1,
                at: at(KERNEL + 0x1234),
            },
            Event::PioWrite {
                port: 0x20,
                data: vec![0x20],
                at: at(KERNEL),
            },
            Event::MmioRead {
                address: 0xd000_0070,
                len: 4,
                at: at(0x40_1000),
            },
            Event::MmioWrite {
                address: 0xd000_1050,
                data: vec![1, 0, 0, 0],
                at: at(u64::MAX),
            },
            Event::Halt { at: at(0) },
            Event::InterruptWindow { at: at(KERNEL) },
            Event::MsrRead {
                index: 0xc000_0103,
                at: at(KERNEL),
            },
            Event::ReadResult(vec![0xff, 0x12]),
            Event::Clock(10_000_000),
            Event::Clock(10_000_001),
            Event::Wall(1_700_000_000_000_000_000),
            Event::Inject(0x30),
            Event::Switch(3),
            Event::AgentInput(b"job".to_vec()),
            Event::AgentOutput(b"ready".to_vec()),
            Event::DiskWrite {
                offset: 4096,
                len: 512,
                digest: 0xdead_beef,
            },
            Event::StateCheck {
                memory: 0x0123_4567_89ab_cdef,
            },
            Event::NetReceived(vec![0xff; 42]),
            Event::net_sent(b"frame"),
            Event::Preempted {
                at: at(0x40_1234),
                pages: vec![(0x100, 3), (0x104, 1), (0x7_ffff, 1)],
                instance: 0xfeed_f00d,
                ran_ns: None,
                user_code: None,
            },
            Event::Preempted {
                at: at(0x40_1234),
                pages: vec![(0x100, 2)],
                instance: 0xfeed_f00e,
                ran_ns: Some(12_345_678),
                user_code: None,
            },
            Event::Preempted {
                at: at(0x40_1234),
                pages: vec![(0x100, 2)],
                instance: 0xfeed_f00f,
                ran_ns: None,
                user_code: Some(0x1_2345_6789),
            },
            Event::Preempted {
                at: at(0x40_1234),
                pages: vec![(0x100, 2)],
                instance: 0xfeed_f010,
                ran_ns: Some(0),
                user_code: Some(0),
            },
        ]
    }

    #[test]
    fn every_kind_round_trips_across_chunks() {
        let events = every_kind();
        let mut encoder = Encoder::default();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for (i, event) in events.iter().enumerate() {
            encoder.encode(event, if i < 9 { &mut first } else { &mut second });
        }
        let mut decoder = Decoder::default();
        let mut decoded = decoder.decode_all(&first).unwrap();
        decoded.extend(decoder.decode_all(&second).unwrap());
        assert_eq!(decoded, events);
        assert_eq!(events.iter().filter(|e| e.is_exit()).count(), 11);
    }

    /// An exit at the same place as the last costs its tag, one byte of
    /// RIP and the eight of the digest; a nearby one a few bytes more.
    #[test]
    fn an_exits_place_costs_a_few_bytes_of_rip_and_eight_of_digest() {
        let mut encoder = Encoder::default();
        let mut first = Vec::new();
        encoder.encode(&Event::Halt { at: at(KERNEL) }, &mut first);
        let mut again = Vec::new();
        encoder.encode(&Event::Halt { at: at(KERNEL) }, &mut again);
        assert_eq!(again.len(), 1 + 1 + 8);
        let mut back = Vec::new();
        encoder.encode(
            &Event::Halt {
                at: at(KERNEL - 100),
            },
            &mut back,
        );
        assert_eq!(back.len(), 1 + 2 + 8);
    }

    #[test]
    fn a_varint_past_64_bits_is_refused_not_truncated() {
        let mut max = Vec::new();
        put_varint(&mut max, u64::MAX);
        assert_eq!(max.len(), 10);
        let mut wall = vec![EventKind::Wall as u8];
        wall.extend_from_slice(&max);
        assert_eq!(
            Decoder::default().decode_all(&wall),
            Ok(vec![Event::Wall(u64::MAX)])
        );
        *wall.last_mut().unwrap() = 0x02;
        assert_eq!(
            Decoder::default().decode_all(&wall),
            Err(DecodeError {
                offset: 11,
                what: "varint longer than 64 bits"
            })
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        // The decoder meets arbitrary bytes (a corrupt chunk whose checksum
        // was forged): it must return events or an error, never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Decoder::default().decode_all(&bytes);
        }
    }
}
