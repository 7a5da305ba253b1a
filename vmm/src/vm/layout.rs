//! Where the machine's devices sit (the virtio devices' MMIO pages and
//! PIC lines, the clock's page) and the names a trace's readers see for
//! the device behind a port, an address or an exit.

use kvm_ioctls::VcpuExit;

use crate::devices::apic::{APIC_BASE, APIC_SIZE};
use crate::devices::cmos::{CMOS_PORT, CMOS_PORT_LEN};
use crate::devices::i8042;
use crate::devices::paravirt::{DOORBELL_PORT, DOORBELL_PORT_LEN, SMP_PORT, SMP_PORT_LEN};
use crate::devices::pic;
use crate::devices::pit::{PIT_PORT, PIT_PORT_LEN};
use crate::devices::serial::{COM1_BASE, UART_REGISTERS};
use crate::devices::vector_state::{VECTOR_STATE_PORT, VECTOR_STATE_PORT_LEN};
use crate::memory::{MMIO_DEVICE_SIZE, MMIO_START};

/// The SYSCALL instruction's entry point (IA32_LSTAR).
pub(super) const MSR_LSTAR: u32 = 0xc000_0082;

/// The virtio devices: where each sits and which PIC line it raises.
pub(super) const BLOCK_MMIO: u64 = MMIO_START;
pub(super) const BLOCK_IRQ: u8 = 5;
pub(super) const CONSOLE_MMIO: u64 = MMIO_START + MMIO_DEVICE_SIZE;
pub(super) const CONSOLE_IRQ: u8 = 6;
/// The paravirtual clock's register page (see `devices::paravirt`).
pub(super) const CLOCK_MMIO: u64 = MMIO_START + 2 * MMIO_DEVICE_SIZE;
/// The network card, only with `--net` (`VmConfig::net`). IRQ 3 is COM2's,
/// which this machine does not have.
pub(super) const NET_MMIO: u64 = MMIO_START + 3 * MMIO_DEVICE_SIZE;
pub(super) const NET_IRQ: u8 = 3;
/// The input disk, only when inputs go by disk (`VmConfig::input_disk`).
/// IRQ 7 is LPT1's, which this machine does not have.
pub(super) const INPUT_DISK_MMIO: u64 = MMIO_START + 4 * MMIO_DEVICE_SIZE;
pub(super) const INPUT_DISK_IRQ: u8 = 7;
pub(super) const PIT_IRQ: u8 = 0;
/// Where x86-64 Linux maps its kernel: addresses from here up are its.
pub(super) const KERNEL_SPACE: u64 = 0xffff_8000_0000_0000;

/// The name of the device behind I/O port `port` (`none` where no device
/// sits: the guest probed an empty port), for people reading a trace.
pub fn port_device(port: u16) -> &'static str {
    let port = u64::from(port);
    let within = |base: u64, len: u64| (base..base + len).contains(&port);
    // The PIC's three blocks are two ports each (`pic::pio_devices`).
    if [pic::MASTER_PORT, pic::SLAVE_PORT, pic::ELCR_PORT]
        .into_iter()
        .any(|base| within(base, 2))
    {
        "pic"
    } else if within(PIT_PORT, PIT_PORT_LEN) {
        "pit"
    } else if within(CMOS_PORT, CMOS_PORT_LEN) {
        "cmos"
    } else if within(COM1_BASE, UART_REGISTERS) {
        "serial"
    } else if within(DOORBELL_PORT.into(), DOORBELL_PORT_LEN) {
        "doorbell"
    } else if within(SMP_PORT.into(), SMP_PORT_LEN) {
        "smp"
    } else if within(VECTOR_STATE_PORT.into(), VECTOR_STATE_PORT_LEN) {
        "vector-state"
    } else if port == i8042::DATA_PORT || port == i8042::COMMAND_PORT {
        "i8042"
    } else {
        "none"
    }
}

/// Every name `port_device`, `mmio_device` and `exit_device` give: the
/// devices exits are timed and delayed by.
pub const EXIT_DEVICES: &[&str] = &[
    "pic",
    "pit",
    "cmos",
    "serial",
    "doorbell",
    "smp",
    "vector-state",
    "apic",
    "i8042",
    "virtio-blk",
    "virtio-console",
    "virtio-net",
    "input-disk",
    "clock",
    "halt",
    "msr",
    "interrupt-window",
    "none",
];

/// The device (or, where none is involved, the reason) of a VM exit.
pub(super) fn exit_device(exit: &VcpuExit) -> &'static str {
    match exit {
        VcpuExit::IoIn(port, _) | VcpuExit::IoOut(port, _) => port_device(*port),
        VcpuExit::MmioRead(address, _) | VcpuExit::MmioWrite(address, _) => mmio_device(*address),
        VcpuExit::Hlt => "halt",
        VcpuExit::X86Rdmsr(_) => "msr",
        VcpuExit::IrqWindowOpen => "interrupt-window",
        _ => "none",
    }
}

/// The name of the device behind guest-physical MMIO `address`.
pub fn mmio_device(address: u64) -> &'static str {
    let within = |base: u64| (base..base + MMIO_DEVICE_SIZE).contains(&address);
    if within(BLOCK_MMIO) {
        "virtio-blk"
    } else if within(CONSOLE_MMIO) {
        "virtio-console"
    } else if within(CLOCK_MMIO) {
        "clock"
    } else if within(NET_MMIO) {
        "virtio-net"
    } else if within(INPUT_DISK_MMIO) {
        "input-disk"
    } else if (APIC_BASE..APIC_BASE + APIC_SIZE).contains(&address) {
        "apic"
    } else {
        "none"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_named_by_the_device_at_their_address() {
        assert_eq!(port_device(0x3fd), "serial");
        assert_eq!(port_device(0x21), "pic");
        assert_eq!(port_device(0x43), "pit");
        assert_eq!(port_device(0x441), "doorbell");
        assert_eq!(port_device(0x454), "vector-state");
        assert_eq!(port_device(0x80), "none");
        assert_eq!(mmio_device(CLOCK_MMIO + 8), "clock");
        assert_eq!(mmio_device(BLOCK_MMIO), "virtio-blk");
        assert_eq!(mmio_device(MMIO_START - 1), "none");
        // Every name exits are timed and delayed by is listed.
        let ports = (0..=u16::MAX).map(port_device);
        let mmio = (0..5).map(|device| mmio_device(MMIO_START + device * MMIO_DEVICE_SIZE));
        for name in ports.chain(mmio) {
            assert!(EXIT_DEVICES.contains(&name), "{name}");
        }
    }
}
