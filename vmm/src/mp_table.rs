//! The Intel MultiProcessor table: how a guest with N vCPUs finds them.
//!
//! Simpler than ACPI's MADT (no ACPI in the guest kernel at all): a 16-byte
//! floating pointer the kernel finds by scanning the BIOS area, and a
//! configuration table with one entry per CPU and the ISA bus. No I/O APIC
//! entry: the guest runs with `noapic`, its 8259 PIC wired to CPU 0.

use vm_memory::{Bytes, GuestAddress};

use crate::devices::apic::APIC_BASE;
use crate::memory::GuestMemory;

/// In the BIOS area (0xf0000-0xfffff) the kernel scans; not RAM in the
/// guest's memory map, so the kernel leaves it alone.
const FLOATING_POINTER: u64 = 0xf_0000;
const CONFIG_TABLE: u64 = FLOATING_POINTER + 16;
/// MP specification 1.4.
const SPEC_REVISION: u8 = 4;
/// What the APIC's version register says (integrated, see `devices::apic`).
const APIC_VERSION: u8 = 0x14;
const CPU_ENABLED: u8 = 1;
const CPU_BOOT_PROCESSOR: u8 = 2;

/// The most vCPUs a table may list (and provm gives a guest).
pub const MAX_CPUS: u8 = 64;

/// Makes the sum of `bytes` zero by setting the byte at `at`.
fn checksum(bytes: &mut [u8], at: usize) {
    let sum = bytes.iter().fold(0u8, |sum, byte| sum.wrapping_add(*byte));
    bytes[at] = 0u8.wrapping_sub(sum);
}

/// The configuration table for `cpus` CPUs, APIC IDs 0 to `cpus - 1`
/// (CPU 0 boots).
fn config_table(cpus: u8) -> Vec<u8> {
    let mut entries = Vec::new();
    for id in 0..cpus {
        let flags = CPU_ENABLED | if id == 0 { CPU_BOOT_PROCESSOR } else { 0 };
        let mut cpu = [0u8; 20];
        cpu[..4].copy_from_slice(&[0, id, APIC_VERSION, flags]);
        entries.extend_from_slice(&cpu);
    }
    entries.extend_from_slice(&[1, 0]);
    entries.extend_from_slice(b"ISA   ");
    let length = 44 + entries.len();
    let mut table = Vec::with_capacity(length);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(length as u16).to_le_bytes());
    table.extend_from_slice(&[SPEC_REVISION, 0]);
    table.extend_from_slice(b"PROVM   ");
    table.extend_from_slice(b"PROVM SMP   ");
    table.extend_from_slice(&[0; 4 + 2]); // no OEM table
    table.extend_from_slice(&(u16::from(cpus) + 1).to_le_bytes());
    table.extend_from_slice(&(APIC_BASE as u32).to_le_bytes());
    table.extend_from_slice(&[0; 4]); // no extended table
    table.extend_from_slice(&entries);
    checksum(&mut table, 7);
    table
}

fn floating_pointer() -> [u8; 16] {
    let mut pointer = [0u8; 16];
    pointer[..4].copy_from_slice(b"_MP_");
    pointer[4..8].copy_from_slice(&(CONFIG_TABLE as u32).to_le_bytes());
    // Length in 16-byte units; feature bytes 0: a table follows, and the
    // PIC is in virtual-wire mode (no IMCR).
    pointer[8] = 1;
    pointer[9] = SPEC_REVISION;
    checksum(&mut pointer, 10);
    pointer
}

/// Writes the table for `cpus` CPUs into guest memory.
pub fn write(memory: &GuestMemory, cpus: u8) -> Result<(), vm_memory::GuestMemoryError> {
    memory.write_slice(&floating_pointer(), GuestAddress(FLOATING_POINTER))?;
    memory.write_slice(&config_table(cpus), GuestAddress(CONFIG_TABLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums_to_zero(bytes: &[u8]) -> bool {
        bytes.iter().fold(0u8, |sum, byte| sum.wrapping_add(*byte)) == 0
    }

    #[test]
    fn the_tables_check_out_as_the_kernel_checks_them() {
        let table = config_table(4);
        assert!(sums_to_zero(&table));
        assert_eq!(
            usize::from(u16::from_le_bytes([table[4], table[5]])),
            table.len()
        );
        assert_eq!(table.len(), 44 + 4 * 20 + 8);
        // CPU 0 boots, the others are enabled.
        assert_eq!(&table[44..48], &[0, 0, APIC_VERSION, 3]);
        assert_eq!(&table[64..68], &[0, 1, APIC_VERSION, 1]);
        assert!(sums_to_zero(&floating_pointer()));
    }
}
