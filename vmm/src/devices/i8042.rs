//! Just enough of the i8042 keyboard controller for Linux to reboot: its
//! BOOT_KBD method waits for the status port (0x64) to show an empty input
//! buffer, then writes command 0xfe, which pulses the CPU reset line.
//!
//! There is no keyboard: the status register reads 0 (neither buffer full),
//! so Linux's i8042 driver finds no controller answering its commands and
//! gives up, and the data port (0x60) reads 0.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

use super::persist::{InvalidState, Persist};
use crate::bus::{BusDevice, SharedDevice};

pub const DATA_PORT: u64 = 0x60;
pub const COMMAND_PORT: u64 = 0x64;

/// Controller command: pulse output port bit 0, the CPU's reset line.
const PULSE_RESET: u8 = 0xfe;

/// The controller's command/status port, holding the reset line's state.
#[derive(Default, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct I8042 {
    reset_requested: bool,
}

impl I8042 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the guest has pulsed the reset line since the last call.
    pub fn take_reset_request(&mut self) -> bool {
        std::mem::take(&mut self.reset_requested)
    }
}

/// A pending reset request is the whole state: any value is one the guest
/// can reach.
impl Persist for I8042 {
    type State = I8042;

    fn save(&self) -> I8042 {
        self.clone()
    }

    fn restore(&mut self, state: &I8042) -> Result<(), InvalidState> {
        *self = state.clone();
        Ok(())
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        if data.first() == Some(&PULSE_RESET) {
            self.reset_requested = true;
        }
    }
}

/// The data port, with no keyboard behind it.
struct NoKeyboard;

impl BusDevice for NoKeyboard {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

/// The i8042's port-bus registrations as (base, length, device): the data
/// port 0x60 and the command/status port 0x64, one byte each (0x61, between
/// them, is the PC's system control port, not the i8042's).
pub fn pio_devices(i8042: &Arc<Mutex<I8042>>) -> [(u64, u64, SharedDevice); 2] {
    [
        (DATA_PORT, 1, Arc::new(Mutex::new(NoKeyboard))),
        (COMMAND_PORT, 1, i8042.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Bus;

    fn bus_with_i8042() -> (Bus, Arc<Mutex<I8042>>) {
        let i8042 = Arc::new(Mutex::new(I8042::new()));
        let mut bus = Bus::default();
        for (base, len, device) in pio_devices(&i8042) {
            bus.insert(base, len, device).unwrap();
        }
        (bus, i8042)
    }

    fn inb(bus: &Bus, port: u64) -> u8 {
        let mut data = [0xaa];
        assert!(bus.read(port, &mut data));
        data[0]
    }

    #[test]
    fn status_and_data_read_zero() {
        let (bus, _) = bus_with_i8042();
        assert_eq!(inb(&bus, 0x64), 0);
        assert_eq!(inb(&bus, 0x60), 0);
        assert!(!bus.read(0x61, &mut [0]), "port 0x61 is left free");
    }

    #[test]
    fn pulse_reset_command_is_reported_once() {
        let (bus, i8042) = bus_with_i8042();
        assert!(!i8042.lock().unwrap().take_reset_request());
        assert!(bus.write(0x64, &[0xfe]));
        assert!(i8042.lock().unwrap().take_reset_request());
        assert!(!i8042.lock().unwrap().take_reset_request());
    }

    #[test]
    fn other_writes_do_not_reset() {
        let (bus, i8042) = bus_with_i8042();
        // Read controller configuration, self-test; 0xfe to the keyboard.
        assert!(bus.write(0x64, &[0x20]));
        assert!(bus.write(0x64, &[0xaa]));
        assert!(bus.write(0x60, &[0xfe]));
        assert!(!i8042.lock().unwrap().take_reset_request());
    }

    #[test]
    fn state_round_trips() {
        let (bus, i8042) = bus_with_i8042();
        assert!(bus.write(0x64, &[0xfe]));
        let saved = i8042.lock().unwrap().save();
        let mut restored = I8042::new();
        restored.restore(&saved).unwrap();
        assert!(restored.take_reset_request());
    }
}
