//! The VM-state decoder against hostile snapshots: the whole VM's saved
//! state (vCPU and devices, as traces and the snapshot cache carry it), as
//! provm 242a0b3 saved it for a booted guest (the golden sample), damaged
//! as in `devices::fuzz::hostile_state`, decoded alone and inside a
//! snapshot with memory runs, then restored into every device, which the
//! guest then accesses. Decoding must give an error or a state; restoring
//! must refuse or accept as each device's `Persist` promises; nothing may
//! panic or exceed the allocation bound. The vCPU's part is decoded but not
//! restored: that needs KVM, which checks it itself.

use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use serde_json::Value;

use super::VmState;
use crate::allocation_bound::within_allocation_bound;
use crate::devices::cmos::Cmos;
use crate::devices::fuzz::hostile_state::{damaged_part, damages, restore_then_guest, Damage};
use crate::devices::fuzz::{harness::driver_ops, Fixture, Op};
use crate::devices::i8042::I8042;
use crate::devices::paravirt::Doorbell;
use crate::devices::pic::Pic;
use crate::devices::pit::Pit;
use crate::devices::serial::SerialPort;
use crate::devices::virtio::block::VirtioBlock;
use crate::devices::virtio::console::VirtioConsole;
use crate::devices::virtio::mmio::MmioTransport;
use crate::memory::{self, MemoryImage};

/// Cases per property.
const VM_STATE_CASES: u32 = 1000;

/// A VM state saved by provm at 242a0b3 (machine version 1), of a guest
/// of `GOLDEN_MIB` MiB: its rings and doorbell flag lie there.
const GOLDEN: &[u8] = include_bytes!("../../../tests/data/golden/vm-state.machine-1.json");
const GOLDEN_MIB: u64 = 64;
/// Where the golden state's virtqueues lie.
const GOLDEN_RINGS: std::ops::Range<u64> = 0x28_0000..0x2c_0000;

fn golden() -> Value {
    serde_json::from_slice(GOLDEN).unwrap()
}

/// The golden state, damaged in one part (or anywhere): left to chance
/// alone, most damage would fall on the vCPU's 4 KiB of XSAVE bytes.
fn damaged_golden() -> impl Strategy<Value = (&'static str, Vec<Damage>)> {
    let part = prop::sample::select(vec![
        "",
        "/vcpu",
        "/pic",
        "/pit",
        "/cmos",
        "/serial",
        "/i8042",
        "/doorbell",
        "/block",
        "/console",
    ]);
    (part, damages())
}

fn fixture() -> Fixture {
    Fixture::over(memory::create(GOLDEN_MIB).unwrap())
}

/// Restores each device's part of `state` into a fresh one, as
/// `Vm::restore` does, and has the guest access those restored.
fn restore_devices(fixture: &Fixture, state: &VmState, ops: &[Op]) -> TestCaseResult {
    let _ = state.cpuid();
    restore_then_guest::<Pic>(fixture, &state.pic, ops)?;
    restore_then_guest::<Pit>(fixture, &state.pit, ops)?;
    restore_then_guest::<Cmos>(fixture, &state.cmos, ops)?;
    restore_then_guest::<SerialPort>(fixture, &state.serial, ops)?;
    restore_then_guest::<I8042>(fixture, &state.i8042, ops)?;
    restore_then_guest::<Doorbell>(fixture, &state.doorbell, ops)?;
    restore_then_guest::<MmioTransport<VirtioBlock>>(fixture, &state.block, ops)?;
    restore_then_guest::<MmioTransport<VirtioConsole>>(fixture, &state.console, ops)?;
    Ok(())
}

/// Memory runs as a snapshot holds them: mostly in the guest's RAM (often
/// over the golden state's virtqueues, so that a notify finds chains
/// there), some past its end, in any order.
fn runs() -> impl Strategy<Value = Vec<(u64, Vec<u8>)>> {
    let ram = GOLDEN_MIB << 20;
    let address = prop_oneof![
        2 => GOLDEN_RINGS,
        2 => 0..ram,
        2 => (ram - 0x2000)..(ram + 0x1000),
        1 => any::<u64>(),
    ];
    let run = (address, prop::collection::vec(any::<u8>(), 0..0x2000));
    prop::collection::vec(run, 0..4)
}

/// A snapshot (`provm_trace::snapshot`'s layout) of `state`, whatever its
/// bytes, with `runs`.
fn snapshot_bytes(state: &[u8], runs: &[(u64, Vec<u8>)]) -> Vec<u8> {
    // The layout: header (10 bytes) | state length u32 | state | memory.
    let with_null = provm_trace::snapshot::encode(&Value::Null, runs);
    let (header, rest) = with_null.split_at(10);
    let memory = &rest[4 + b"null".len()..];
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(&(state.len() as u32).to_le_bytes());
    bytes.extend_from_slice(state);
    bytes.extend_from_slice(memory);
    bytes
}

#[test]
fn fuzz_the_golden_state_decodes_and_restores() {
    let fixture = fixture();
    let state: VmState = serde_json::from_slice(GOLDEN).unwrap();
    restore_devices(&fixture, &state, &[]).unwrap();
    let snapshot = snapshot_bytes(GOLDEN, &[(0x1000, vec![1; 4096])]);
    let decoded =
        provm_trace::snapshot::decode::<VmState>(&snapshot, GOLDEN_MIB).expect("the sample");
    assert_eq!(decoded.runs, [(0x1000, vec![1; 4096])]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(VM_STATE_CASES))]

    #[test]
    fn vm_state_decoder_survives_damaged_states(
        (part, damages) in damaged_golden(),
        ops in driver_ops(),
    ) {
        let bytes = damaged_part(golden(), part, &damages);
        let fixture = fixture();
        within_allocation_bound(|| {
            match serde_json::from_slice::<VmState>(&bytes) {
                Ok(state) => restore_devices(&fixture, &state, &ops),
                Err(_) => Ok(()),
            }
        })?;
    }

    #[test]
    fn vm_snapshot_decoder_survives_damaged_snapshots(
        (part, damages) in damaged_golden(),
        runs in runs(),
        ops in driver_ops(),
    ) {
        let bytes = snapshot_bytes(&damaged_part(golden(), part, &damages), &runs);
        let fixture = fixture();
        within_allocation_bound(|| {
            let Ok(snapshot) = provm_trace::snapshot::decode::<VmState>(&bytes, GOLDEN_MIB) else {
                return Ok(());
            };
            // The decoder checked that every run lies in the guest's RAM.
            let image = MemoryImage { runs: snapshot.runs };
            prop_assert!(image.restore(&fixture.mem).is_ok());
            restore_devices(&fixture, &snapshot.state, &ops)
        })?;
    }
}
