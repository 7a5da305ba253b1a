//! The CMOS real-time clock (an MC146818 as PC chipsets embed it): an index
//! port at 0x70 and a data port at 0x71 into 128 bytes of registers and RAM.
//!
//! Linux reads the date and time once at boot (mach_get_cmos_time) to set its
//! wall clock. The time registers are computed from `Clock::wall_ns` at each
//! read, in the format status register B selects (BCD and 24-hour unless the
//! guest says otherwise). They never show an update in progress, and writes
//! to them are dropped: the guest's time comes from the VMM's clock only.
//! No interrupts: IRQ 8 is not wired, so the flags in register C stay clear.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::persist::{require, InvalidState, Persist};
use crate::bus::BusDevice;
use crate::clock::Clock;

pub const CMOS_PORT: u64 = 0x70;
pub const CMOS_PORT_LEN: u64 = 2;

const SECONDS: u8 = 0x00;
const MINUTES: u8 = 0x02;
const HOURS: u8 = 0x04;
const WEEKDAY: u8 = 0x06;
const DAY: u8 = 0x07;
const MONTH: u8 = 0x08;
const YEAR: u8 = 0x09;
const STATUS_A: u8 = 0x0a;
const STATUS_B: u8 = 0x0b;
const STATUS_C: u8 = 0x0c;
const STATUS_D: u8 = 0x0d;
/// A RAM byte on the MC146818; PC firmware keeps the century there (and
/// names it in the ACPI FADT, where Linux looks for it).
const CENTURY: u8 = 0x32;

/// Register A: update in progress, a bit the clock never shows.
const A_UIP: u8 = 0x80;
/// Register B: 24-hour mode (else 12-hour with bit 7 of the hour for PM).
const B_24_HOUR: u8 = 0x02;
/// Register B: binary values (else BCD).
const B_BINARY: u8 = 0x04;
/// Register D: valid RAM and time (the battery is good).
const D_VRT: u8 = 0x80;
/// Registers and RAM behind the index port, which keeps 7 bits (bit 7 masks
/// NMIs on a PC).
const CMOS_BYTES: usize = 128;
const INDEX_MASK: u8 = 0x7f;

pub struct Cmos {
    clock: Arc<dyn Clock>,
    /// Register selected through port 0x70.
    index: u8,
    /// Backing store for everything that is not computed.
    ram: [u8; CMOS_BYTES],
}

/// The selected register and the RAM (the clock registers are computed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CmosState {
    index: u8,
    ram: Vec<u8>,
}

impl Persist for Cmos {
    type State = CmosState;

    fn save(&self) -> CmosState {
        CmosState {
            index: self.index,
            ram: self.ram.to_vec(),
        }
    }

    fn restore(&mut self, state: &CmosState) -> Result<(), InvalidState> {
        require(
            state.index <= INDEX_MASK,
            "CMOS",
            "index",
            state.index,
            "the index port selects one of 128 bytes",
        )?;
        let ram = state.ram.as_slice().try_into().map_err(|_| {
            InvalidState::new("CMOS", "ram", state.ram.len(), "the CMOS has 128 bytes")
        })?;
        self.index = state.index;
        self.ram = ram;
        Ok(())
    }
}

impl Cmos {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let mut ram = [0; CMOS_BYTES];
        // 32.768 kHz time base, 1024 Hz periodic rate: what firmware sets.
        ram[usize::from(STATUS_A)] = 0x26;
        ram[usize::from(STATUS_B)] = B_24_HOUR;
        Cmos {
            clock,
            index: 0,
            ram,
        }
    }

    fn read_register(&self, index: u8) -> u8 {
        match index {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY => {
                self.time_register(index)
            }
            STATUS_A => self.ram[usize::from(index)] & !A_UIP,
            STATUS_C => 0,
            STATUS_D => D_VRT,
            _ => self.ram[usize::from(index)],
        }
    }

    fn write_register(&mut self, index: u8, value: u8) {
        match index {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY => {}
            STATUS_C | STATUS_D => {} // Read-only.
            _ => self.ram[usize::from(index)] = value,
        }
    }

    fn time_register(&self, index: u8) -> u8 {
        let seconds = self.clock.wall_ns() / 1_000_000_000;
        let days = seconds / 86_400;
        let second_of_day = seconds % 86_400;
        let (year, month, day) = civil_from_days(days);
        let hour = (second_of_day / 3600) as u8;
        let b = self.ram[usize::from(STATUS_B)];
        let encode = |value: u8| {
            if b & B_BINARY != 0 {
                value
            } else {
                ((value / 10) << 4) | (value % 10)
            }
        };
        match index {
            SECONDS => encode((second_of_day % 60) as u8),
            MINUTES => encode((second_of_day / 60 % 60) as u8),
            HOURS if b & B_24_HOUR != 0 => encode(hour),
            HOURS => {
                let pm = if hour >= 12 { 0x80 } else { 0 };
                encode((hour + 11) % 12 + 1) | pm
            }
            // 1 is Sunday; the epoch was a Thursday.
            WEEKDAY => encode(((days + 4) % 7 + 1) as u8),
            DAY => encode(day),
            MONTH => encode(month),
            YEAR => encode((year % 100) as u8),
            _ => encode((year / 100) as u8), // CENTURY
        }
    }
}

/// The proleptic Gregorian (year, month, day) `days` after 1970-01-01, by
/// Howard Hinnant's civil_from_days, with eras starting on 0000-03-01.
fn civil_from_days(days: u64) -> (u64, u8, u8) {
    let days = days + 719_468; // 0000-03-01 to 1970-01-01
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let march_based_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * march_based_month + 2) / 5 + 1;
    let month = if march_based_month < 10 {
        march_based_month + 3
    } else {
        march_based_month - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month as u8, day as u8)
}

impl BusDevice for Cmos {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        // The index port is write-only.
        if let (1, Some(byte)) = (offset, data.first_mut()) {
            *byte = self.read_register(self.index);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        if offset == 0 {
            // Bit 7 of the index port masks NMIs on a PC; there are none.
            self.index = value & INDEX_MASK;
        } else {
            self.write_register(self.index, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Wall-clock time set by the test.
    struct FakeClock(AtomicU64);

    impl Clock for FakeClock {
        fn monotonic_ns(&self) -> u64 {
            0
        }

        fn wall_ns(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn cmos_at(unix_seconds: u64) -> (Cmos, Arc<FakeClock>) {
        let clock = Arc::new(FakeClock(AtomicU64::new(unix_seconds * 1_000_000_000)));
        (Cmos::new(clock.clone()), clock)
    }

    fn read(cmos: &mut Cmos, index: u8) -> u8 {
        cmos.write(0, &[index]);
        let mut data = [0xaa];
        cmos.read(1, &mut data);
        data[0]
    }

    fn write(cmos: &mut Cmos, index: u8, value: u8) {
        cmos.write(0, &[index]);
        cmos.write(1, &[value]);
    }

    /// Seconds, minutes, hours, weekday, day, month, year, century.
    fn date_time(cmos: &mut Cmos) -> [u8; 8] {
        [0x00, 0x02, 0x04, 0x06, 0x07, 0x08, 0x09, 0x32].map(|index| read(cmos, index))
    }

    /// 2026-11-22 05:30:07 UTC, a Sunday.
    const SUNDAY_MORNING: u64 = 1_795_325_407;

    #[test]
    fn date_and_time_in_bcd() {
        let (mut cmos, clock) = cmos_at(SUNDAY_MORNING);
        assert_eq!(
            date_time(&mut cmos),
            [0x07, 0x30, 0x05, 0x01, 0x22, 0x11, 0x26, 0x20]
        );
        // Each read looks at the clock.
        clock.0.store(
            SUNDAY_MORNING * 1_000_000_000 + 2_500_000_000,
            Ordering::SeqCst,
        );
        assert_eq!(read(&mut cmos, 0x00), 0x09);
    }

    #[test]
    fn calendar_edges() {
        let (mut cmos, _) = cmos_at(0);
        assert_eq!(
            date_time(&mut cmos),
            [0x00, 0x00, 0x00, 0x05, 0x01, 0x01, 0x70, 0x19]
        );
        // 2024-02-29 23:59:59, a Thursday.
        let (mut cmos, _) = cmos_at(1_709_251_199);
        assert_eq!(
            date_time(&mut cmos),
            [0x59, 0x59, 0x23, 0x05, 0x29, 0x02, 0x24, 0x20]
        );
        // 2000-03-01, a Wednesday, after a leap day in a century year.
        let (mut cmos, _) = cmos_at(951_868_800);
        assert_eq!(
            date_time(&mut cmos),
            [0x00, 0x00, 0x00, 0x04, 0x01, 0x03, 0x00, 0x20]
        );
    }

    #[test]
    fn status_registers() {
        let (mut cmos, _) = cmos_at(SUNDAY_MORNING);
        assert_eq!(read(&mut cmos, 0x0a), 0x26);
        assert_eq!(read(&mut cmos, 0x0b), 0x02);
        assert_eq!(read(&mut cmos, 0x0c), 0x00);
        assert_eq!(read(&mut cmos, 0x0d), 0x80);
        // Update in progress never shows; C and D are read-only.
        write(&mut cmos, 0x0a, 0xa6);
        assert_eq!(read(&mut cmos, 0x0a), 0x26);
        write(&mut cmos, 0x0c, 0xff);
        write(&mut cmos, 0x0d, 0x00);
        assert_eq!(read(&mut cmos, 0x0c), 0x00);
        assert_eq!(read(&mut cmos, 0x0d), 0x80);
    }

    #[test]
    fn register_b_selects_binary_and_12_hour_formats() {
        // 2026-11-22 17:45:00.
        let (mut cmos, clock) = cmos_at(1_795_369_500);
        write(&mut cmos, 0x0b, 0x06);
        assert_eq!(read(&mut cmos, 0x0b), 0x06);
        assert_eq!(
            date_time(&mut cmos),
            [0, 45, 17, 1, 22, 11, 26, 20],
            "binary, 24-hour"
        );
        write(&mut cmos, 0x0b, 0x00);
        assert_eq!(read(&mut cmos, 0x04), 0x85, "BCD, 12-hour, 5 PM");
        // 00:15 is 12 AM.
        clock
            .0
            .store(1_795_306_500 * 1_000_000_000, Ordering::SeqCst);
        assert_eq!(read(&mut cmos, 0x04), 0x12);
    }

    #[test]
    fn nmi_mask_bit_of_the_index_is_ignored() {
        let (mut cmos, _) = cmos_at(SUNDAY_MORNING);
        assert_eq!(read(&mut cmos, 0x80 | 0x02), 0x30);
        assert_eq!(read(&mut cmos, 0x80 | 0x0d), 0x80);
    }

    #[test]
    fn time_writes_are_dropped_and_ram_keeps_values() {
        let (mut cmos, _) = cmos_at(SUNDAY_MORNING);
        write(&mut cmos, 0x04, 0x11);
        write(&mut cmos, 0x32, 0x19);
        assert_eq!(read(&mut cmos, 0x04), 0x05);
        assert_eq!(read(&mut cmos, 0x32), 0x20);
        write(&mut cmos, 0x01, 0x42);
        write(&mut cmos, 0x7f, 0x99);
        assert_eq!(read(&mut cmos, 0x01), 0x42);
        assert_eq!(read(&mut cmos, 0x7f), 0x99);
        assert_eq!(read(&mut cmos, 0x10), 0x00);
    }

    #[test]
    fn index_port_is_write_only() {
        let (mut cmos, _) = cmos_at(SUNDAY_MORNING);
        cmos.write(0, &[0x0d]);
        let mut data = [0xaa];
        cmos.read(0, &mut data);
        assert_eq!(data, [0]);
    }

    #[test]
    fn state_round_trips() {
        let (mut cmos, _) = cmos_at(SUNDAY_MORNING);
        write(&mut cmos, 0x0b, 0x06);
        write(&mut cmos, 0x40, 0x99);
        let saved = cmos.save();
        let (mut restored, _) = cmos_at(0);
        restored.restore(&saved).unwrap();
        assert_eq!(restored.save(), saved);
        assert_eq!(read(&mut restored, 0x40), 0x99);
    }

    #[test]
    fn restore_refuses_an_index_or_ram_out_of_range() {
        let (cmos, _) = cmos_at(SUNDAY_MORNING);
        let (mut target, _) = cmos_at(0);
        let mut state = cmos.save();
        state.index = 200;
        let error = target.restore(&state).unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.value.as_str()),
            ("index", "200")
        );
        let mut state = cmos.save();
        state.ram.truncate(100);
        assert_eq!(target.restore(&state).unwrap_err().field, "ram");
        assert_eq!(target.save(), cmos_at(0).0.save(), "left unchanged");
    }
}
