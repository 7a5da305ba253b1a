//! The paravirtual clock against a hostile guest: whatever it reads or
//! writes, at any offset and width, only a whole read of the register gives
//! the virtual clock, every other read gives zeros, and writes change
//! nothing. (The doorbell is `Fuzzed` like the other devices.)

use std::sync::Arc;

use proptest::prelude::*;

use super::harness::{ops, run, Op, StepClock};
use crate::allocation_bound::within_allocation_bound;
use crate::bus::BusDevice;
use crate::clock::Clock;
use crate::devices::paravirt::ParavirtClock;

/// Cases of the property below.
const CLOCK_CASES: u32 = 2000;

/// The clock's MMIO page.
const CLOCK_PAGE: u64 = 0x1000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CLOCK_CASES))]

    #[test]
    fn paravirt_clock_reads_only_the_virtual_clock(ops in ops(CLOCK_PAGE)) {
        let clock = Arc::new(StepClock::default());
        let mut device = ParavirtClock::new(clock.clone());
        within_allocation_bound(|| {
            for op in &ops {
                if let Op::Read { offset, width } = *op {
                    let mut data = [0xa5; 8];
                    device.read(offset, &mut data[..width]);
                    let expected = match (offset, width) {
                        (0, 8) => clock.monotonic_ns().to_le_bytes(),
                        _ => [0; 8],
                    };
                    prop_assert_eq!(&data[..width], &expected[..width], "read at {}", offset);
                    prop_assert!(data[width..].iter().all(|&b| b == 0xa5));
                } else {
                    // Writes and time passing, which a read then shows.
                    run(std::slice::from_ref(op), &mut device, |_, ns| {
                        clock.advance(ns);
                    });
                }
            }
            Ok(())
        })?;
    }
}
