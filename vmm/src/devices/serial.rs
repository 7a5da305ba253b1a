//! The guest's console: a 16550 UART (vm-superio) at COM1 whose output is kept
//! as a bounded tail for error reports and optionally echoed to the host.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
use vm_superio::{Serial, Trigger};

use super::persist::{InvalidState, Persist};
use super::SharedIrqLine;
use crate::bus::BusDevice;

pub const COM1_BASE: u64 = 0x3f8;
pub const COM1_IRQ: u8 = 4;
pub const UART_REGISTERS: u64 = 8;
/// How much of the console the VMM remembers for error messages.
const TAIL_BYTES: usize = 16 * 1024;

/// The last bytes the guest printed on its console.
#[derive(Clone, Default)]
pub struct ConsoleTail(Arc<Mutex<VecDeque<u8>>>);

impl ConsoleTail {
    /// The last `lines` lines, lossily decoded.
    pub fn last_lines(&self, lines: usize) -> String {
        let bytes: Vec<u8> = self.0.lock().unwrap().iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes).replace('\r', "");
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn push(&self, bytes: &[u8]) {
        let mut tail = self.0.lock().unwrap();
        tail.extend(bytes);
        let excess = tail.len().saturating_sub(TAIL_BYTES);
        tail.drain(..excess);
    }
}

/// Where console bytes go: the tail, and the host's stderr when asked.
#[derive(Clone)]
pub struct ConsoleSink {
    tail: ConsoleTail,
    echo: bool,
}

impl Write for ConsoleSink {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.tail.push(bytes);
        if self.echo {
            io::stderr().write_all(bytes)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct IrqTrigger(SharedIrqLine);

impl Trigger for IrqTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.pulse();
        Ok(())
    }
}

pub struct SerialPort(Serial<IrqTrigger, vm_superio::serial::NoEvents, ConsoleSink>);

/// vm-superio's receive FIFO size.
const RECEIVE_FIFO: usize = 64;

/// The UART's registers and receive buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialPortState(#[serde(with = "SerialStateDef")] SerialState);

/// vm-superio's `SerialState` fields, for serde.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SerialState")]
#[serde(deny_unknown_fields)]
struct SerialStateDef {
    baud_divisor_low: u8,
    baud_divisor_high: u8,
    interrupt_enable: u8,
    interrupt_identification: u8,
    line_control: u8,
    line_status: u8,
    modem_control: u8,
    modem_status: u8,
    scratch: u8,
    in_buffer: Vec<u8>,
}

impl SerialPort {
    pub fn new(irq: SharedIrqLine, tail: ConsoleTail, echo: bool) -> Self {
        SerialPort(Serial::new(IrqTrigger(irq), ConsoleSink { tail, echo }))
    }
}

impl Persist for SerialPort {
    type State = SerialPortState;

    fn save(&self) -> SerialPortState {
        SerialPortState(self.0.state())
    }

    /// Puts back a saved state, keeping the port's wiring.
    fn restore(&mut self, SerialPortState(state): &SerialPortState) -> Result<(), InvalidState> {
        let irq = IrqTrigger(self.0.interrupt_evt().0.clone());
        let sink = self.0.writer().clone();
        // The trigger cannot fail, so the only refusal is a receive buffer
        // larger than the FIFO.
        self.0 =
            Serial::from_state(state, irq, vm_superio::serial::NoEvents, sink).map_err(|_| {
                InvalidState::new(
                    "serial port",
                    "in_buffer",
                    format!("{} bytes", state.in_buffer.len()),
                    format!("the receive FIFO holds {RECEIVE_FIFO}"),
                )
            })?;
        Ok(())
    }
}

impl BusDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let [byte] = data {
            *byte = self.0.read(offset as u8);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let [byte] = data {
            // Only a failing host stderr can make this fail; the guest must not notice.
            let _ = self.0.write(offset as u8, *byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoIrq;
    impl super::super::IrqLine for NoIrq {
        fn set_level(&self, _high: bool) {}
    }

    #[test]
    fn transmitted_bytes_reach_the_tail() {
        let tail = ConsoleTail::default();
        let mut port = SerialPort::new(Arc::new(NoIrq), tail.clone(), false);
        for byte in b"one\r\ntwo\r\nthree\r\n" {
            port.write(0, &[*byte]);
        }
        assert_eq!(tail.last_lines(2), "two\nthree");
    }

    #[test]
    fn tail_is_bounded() {
        let tail = ConsoleTail::default();
        tail.push(&vec![b'x'; TAIL_BYTES * 2]);
        assert_eq!(tail.0.lock().unwrap().len(), TAIL_BYTES);
    }

    fn port() -> SerialPort {
        SerialPort::new(Arc::new(NoIrq), ConsoleTail::default(), false)
    }

    #[test]
    fn state_round_trips() {
        let mut original = port();
        original.write(3, &[0x03]);
        original.write(7, &[0x5a]);
        let saved = original.save();
        let mut restored = port();
        restored.restore(&saved).unwrap();
        assert_eq!(restored.save(), saved);
    }

    #[test]
    fn restore_refuses_more_than_the_fifo_holds() {
        let mut state = port().save();
        state.0.in_buffer = vec![b'x'; RECEIVE_FIFO + 1];
        let mut target = port();
        let error = target.restore(&state).unwrap_err();
        assert_eq!(
            (error.field.as_str(), error.value.as_str()),
            ("in_buffer", "65 bytes")
        );
        assert_eq!(target.save(), port().save(), "left unchanged");
    }
}
