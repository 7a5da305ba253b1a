//! provm's two paravirtual devices, the VMM's side of kernel patch 0007
//! (kernels/patches): a clock the guest kernel uses as its clocksource, and
//! the interrupt doorbell.
//!
//! Why they exist: the VMM hides the TSC and injects interrupts only at VM
//! exits, so that every clock reading and every injection point is an input
//! it can log and replay. Then time would pass for the guest only when a
//! tick is delivered, and a tick due while the guest has interrupts off
//! would wait for an exit that has them on. The clock makes every reading
//! of guest time an exit answered by the VMM's virtual clock; the doorbell
//! lets the guest exit at the moment it enables interrupts again, if the VMM
//! has marked an interrupt as waiting.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::persist::{require, InvalidState, Persist};
use crate::bus::BusDevice;
use crate::clock::Clock;

/// The clock's MMIO page holds one register: the virtual clock in
/// nanoseconds, read as 8 bytes at offset 0.
pub struct ParavirtClock {
    clock: Arc<dyn Clock>,
}

impl ParavirtClock {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        ParavirtClock { clock }
    }
}

impl BusDevice for ParavirtClock {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset != 0 || data.len() != 8 {
            // Only the whole register reads the clock: a reading is an
            // input, and the kernel never splits it.
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.clock.monotonic_ns().to_le_bytes());
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

/// The doorbell's ports, from its base: a write of any byte at 0 rings, at
/// 1 checks in (every 256th return to user mode); for both the exit is the
/// point, at which the VMM delivers or marks what waits, and nothing else
/// happens. A 4-byte write at 4 tells the guest-physical address of the
/// byte the VMM sets when an interrupt waits.
pub const DOORBELL_PORT: u16 = 0x440;
pub const DOORBELL_PORT_LEN: u64 = 8;
const RING: u64 = 0;
const CHECK_IN: u64 = 1;
const FLAG_ADDRESS: u64 = 4;

/// Where the guest kernel keeps its doorbell byte, once it has said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doorbell {
    flag: Option<u64>,
    /// Guest RAM's size: a flag outside it is refused.
    ram_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorbellState {
    flag: Option<u64>,
}

impl Doorbell {
    pub fn new(ram_bytes: u64) -> Self {
        Doorbell {
            flag: None,
            ram_bytes,
        }
    }

    /// The guest-physical address of the doorbell byte, if the guest kernel
    /// has one (a kernel without patch 0007 has not).
    pub fn flag(&self) -> Option<u64> {
        self.flag
    }
}

impl BusDevice for Doorbell {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match (offset, data) {
            (RING | CHECK_IN, _) => {}
            (FLAG_ADDRESS, &[a, b, c, d]) => {
                let address = u64::from(u32::from_le_bytes([a, b, c, d]));
                if address < self.ram_bytes {
                    self.flag = Some(address);
                } else {
                    tracing::warn!("doorbell flag at {address:#x} is outside guest RAM: ignored");
                }
            }
            _ => tracing::warn!(offset, len = data.len(), "doorbell: write ignored"),
        }
    }
}

impl Persist for Doorbell {
    type State = DoorbellState;

    fn save(&self) -> DoorbellState {
        DoorbellState { flag: self.flag }
    }

    fn restore(&mut self, state: &DoorbellState) -> Result<(), InvalidState> {
        if let Some(address) = state.flag {
            require(
                address < self.ram_bytes,
                "doorbell",
                "flag",
                format!("{address:#x}"),
                "outside guest RAM",
            )?;
        }
        self.flag = state.flag;
        Ok(())
    }
}

/// The SMP kernel's ports (kernels/smp): a write of any byte at 0 says the
/// guest kernel is waiting for another CPU (`cpu_relax()`), and the VMM may
/// run another vCPU; a 4-byte write at 4 asks it to start an AP and gives
/// the guest-physical address of the start block (`StartBlock`).
pub const SMP_PORT: u16 = 0x448;
pub const SMP_PORT_LEN: u64 = 8;
const RELAX: u64 = 0;
const START_AP: u64 = 4;

/// What the guest asked for at the SMP ports, for the VM to act on right
/// after the exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmpRequest {
    Relax,
    StartAp { block: u64 },
}

/// The start block the guest kernel hands over with `SmpRequest::StartAp`:
/// APIC ID, 64-bit entry and CR3, each 32 bits (all below 4 GiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartBlock {
    pub apic_id: u32,
    pub entry: u32,
    pub cr3: u32,
}

impl StartBlock {
    pub const LEN: usize = 16;

    pub fn parse(bytes: &[u8; Self::LEN]) -> Self {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        StartBlock {
            apic_id: word(0),
            entry: word(4),
            cr3: word(8),
        }
    }
}

#[derive(Default)]
pub struct SmpPorts {
    request: Option<SmpRequest>,
}

impl SmpPorts {
    /// The request of the exit just handled, if it was one.
    pub fn take_request(&mut self) -> Option<SmpRequest> {
        self.request.take()
    }
}

impl BusDevice for SmpPorts {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.request = match (offset, data) {
            (RELAX, _) => Some(SmpRequest::Relax),
            (START_AP, &[a, b, c, d]) => Some(SmpRequest::StartAp {
                block: u64::from(u32::from_le_bytes([a, b, c, d])),
            }),
            _ => {
                tracing::warn!(offset, len = data.len(), "smp port: write ignored");
                None
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(u64);

    impl Clock for Fixed {
        fn monotonic_ns(&self) -> u64 {
            self.0
        }
        fn wall_ns(&self) -> u64 {
            0
        }
    }

    #[test]
    fn the_clock_register_reads_the_virtual_clock() {
        let mut clock = ParavirtClock::new(Arc::new(Fixed(0x1122_3344_5566_7788)));
        let mut data = [0; 8];
        clock.read(0, &mut data);
        assert_eq!(u64::from_le_bytes(data), 0x1122_3344_5566_7788);
        let mut half = [0xff; 4];
        clock.read(0, &mut half);
        assert_eq!(half, [0; 4]);
    }

    #[test]
    fn the_guest_names_its_flag_inside_ram_only() {
        let mut doorbell = Doorbell::new(1 << 20);
        doorbell.write(FLAG_ADDRESS, &0x2000_0000u32.to_le_bytes());
        assert_eq!(doorbell.flag(), None);
        doorbell.write(FLAG_ADDRESS, &0x1234u32.to_le_bytes());
        assert_eq!(doorbell.flag(), Some(0x1234));
        doorbell.write(RING, &[0]);
        assert_eq!(doorbell.flag(), Some(0x1234));
    }

    #[test]
    fn a_saved_flag_outside_ram_is_refused() {
        let mut doorbell = Doorbell::new(1 << 20);
        let error = doorbell
            .restore(&DoorbellState {
                flag: Some(1 << 20),
            })
            .unwrap_err();
        assert_eq!(error.field, "flag");
        assert_eq!(doorbell.flag(), None);
        let saved = DoorbellState { flag: Some(64) };
        doorbell.restore(&saved).unwrap();
        assert_eq!(doorbell.save(), saved);
    }

    #[test]
    fn the_smp_ports_carry_a_relax_and_a_start_block() {
        let mut ports = SmpPorts::default();
        ports.write(RELAX, &[0]);
        assert_eq!(ports.take_request(), Some(SmpRequest::Relax));
        assert_eq!(ports.take_request(), None);
        ports.write(START_AP, &0x9000u32.to_le_bytes());
        assert_eq!(
            ports.take_request(),
            Some(SmpRequest::StartAp { block: 0x9000 })
        );
        let mut block = [0u8; StartBlock::LEN];
        block[..12].copy_from_slice(&[1, 0, 0, 0, 0x40, 0x9a, 0, 0, 0, 0xa0, 0, 0]);
        let parsed = StartBlock::parse(&block);
        assert_eq!(
            (parsed.apic_id, parsed.entry, parsed.cr3),
            (1, 0x9a40, 0xa000)
        );
    }
}
