//! Every device's restore against hostile saved states: a state the guest
//! reached is damaged as a corrupt or crafted snapshot would be (fields set
//! to out-of-range values, options filled or emptied, arrays shrunk or
//! grown far past their size, the JSON's bytes flipped, cut or padded),
//! then decoded and restored. Restore must refuse it with an error and
//! leave the device as it was, or accept it such that saving gives the
//! state back; the device restored must then survive any guest accesses,
//! into a state that restores again. All within the allocation bound.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseResult;
use serde::Serialize;
use serde_json::Value;

use super::harness::{assert_round_trip, confined, guest_bytes, Fixture, Fuzzed, Op};
use crate::allocation_bound::within_allocation_bound;
use crate::devices::cmos::Cmos;
use crate::devices::i8042::I8042;
use crate::devices::paravirt::Doorbell;
use crate::devices::pic::Pic;
use crate::devices::pit::Pit;
use crate::devices::serial::SerialPort;
use crate::devices::virtio::block::VirtioBlock;
use crate::devices::virtio::console::{VirtioConsole, MAX_PENDING_OUTPUT};
use crate::devices::virtio::mmio::MmioTransport;

/// Cases per device.
const HOSTILE_STATE_CASES: u32 = 1000;

/// One change to a saved state (its JSON form).
#[derive(Clone, Debug)]
pub(crate) enum Damage {
    /// A number or an empty option (chosen among them by the index) set
    /// to a hostile value.
    Number(Index, Value),
    /// A flag negated.
    Flip(Index),
    /// An array cut or grown (repeating its last element) to a length.
    Resize(Index, usize),
    /// The serialised bytes edited: (where, byte, overwrite / insert /
    /// remove / cut there).
    Bytes(Vec<(Index, u8, u8)>),
}

/// Values at and past the edges of the fields' types and ranges.
fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..300).prop_map(Value::from),
        prop::sample::select(vec![
            0xffu64,
            0x100,
            0xffff,
            0x1_0000,
            u64::from(u32::MAX),
            1 << 32,
            i64::MAX as u64,
            u64::MAX,
        ])
        .prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
    ]
}

fn hostile_length() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..8,
        2 => prop::sample::select(vec![63usize, 64, 65, 127, 128, 129, 255, 256, 257]),
        1 => prop::sample::select(vec![4097usize, 0x1_0001]),
        1 => Just(MAX_PENDING_OUTPUT + 1),
    ]
}

/// The most records a `Resize` makes of an array of them.
const MAX_RECORDS: usize = 300;

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (any::<Index>(), hostile_number()).prop_map(|(at, v)| Damage::Number(at, v)),
        2 => any::<Index>().prop_map(Damage::Flip),
        2 => (any::<Index>(), hostile_length()).prop_map(|(at, len)| Damage::Resize(at, len)),
        1 => prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..4), 1..4)
            .prop_map(Damage::Bytes),
    ]
}

/// None to a few changes: an undamaged state is a case too.
pub(crate) fn damages() -> impl Strategy<Value = Vec<Damage>> {
    prop::collection::vec(damage(), 0..4)
}

/// JSON pointers to the nodes of `value` that `pick` selects, in order.
fn nodes(value: &Value, pick: fn(&Value) -> bool) -> Vec<String> {
    fn walk(value: &Value, at: String, pick: fn(&Value) -> bool, out: &mut Vec<String>) {
        if pick(value) {
            out.push(at.clone());
        }
        match value {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, format!("{at}/{i}"), pick, out);
                }
            }
            Value::Object(fields) => {
                for (name, field) in fields {
                    walk(field, format!("{at}/{name}"), pick, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, String::new(), pick, &mut out);
    out
}

/// The node of `value` that `pick` selects at `at`, if any.
fn node(value: &mut Value, at: Index, pick: fn(&Value) -> bool) -> Option<&mut Value> {
    let all = nodes(value, pick);
    let pointer = all.get(at.index(all.len().max(1)))?;
    value.pointer_mut(pointer)
}

/// `state` serialised as JSON, with `damages` done to it.
pub(crate) fn damaged(state: &impl Serialize, damages: &[Damage]) -> Vec<u8> {
    damaged_part(serde_json::to_value(state).unwrap(), "", damages)
}

/// `state` serialised, with `damages` done to its part at JSON pointer
/// `part` (the byte edits anywhere).
pub(crate) fn damaged_part(mut state: Value, part: &str, damages: &[Damage]) -> Vec<u8> {
    let value = state.pointer_mut(part).expect("the part exists");
    let mut edits = Vec::new();
    for damage in damages {
        match damage {
            Damage::Number(at, number) => {
                if let Some(node) = node(value, *at, |v| v.is_number() || v.is_null()) {
                    *node = number.clone();
                }
            }
            Damage::Flip(at) => {
                if let Some(Value::Bool(flag)) = node(value, *at, Value::is_boolean) {
                    *flag = !*flag;
                }
            }
            Damage::Resize(at, len) => {
                if let Some(Value::Array(items)) = node(value, *at, Value::is_array) {
                    let fill = items.last().cloned().unwrap_or(Value::from(0));
                    // Buffers grow past their bounds; arrays of records
                    // (queues, counters) only past their counts, so that a
                    // case's JSON stays small.
                    let len = match fill {
                        Value::Array(_) | Value::Object(_) => (*len).min(MAX_RECORDS),
                        _ => *len,
                    };
                    items.resize(len, fill);
                }
            }
            Damage::Bytes(bytes) => edits.extend_from_slice(bytes),
        }
    }
    let mut bytes = serde_json::to_vec(&state).unwrap();
    for &(at, byte, how) in &edits {
        if bytes.is_empty() {
            break;
        }
        let at = at.index(bytes.len());
        match how {
            0 => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            2 => drop(bytes.remove(at)),
            _ => bytes.truncate(at),
        }
    }
    bytes
}

/// Restores `state` into a fresh device, and has the guest access it then
/// (at `ops`' offsets within its registers).
/// A refusal must leave the device unchanged; an acceptance must put back
/// exactly `state`, and the state the guest then leaves it in restores.
pub(crate) fn restore_then_guest<D: Fuzzed>(
    fixture: &Fixture,
    state: &D::State,
    ops: &[Op],
) -> Result<Option<D>, TestCaseError> {
    let mut device = D::fresh(fixture);
    let before = device.save();
    if device.restore(state).is_err() {
        prop_assert_eq!(device.save(), before, "a refused state changed the device");
        return Ok(None);
    }
    prop_assert_eq!(&device.save(), state, "restore changed what it accepted");
    device.guest(fixture, &confined(ops, D::REGISTERS));
    assert_round_trip(&device, &mut D::fresh(fixture));
    Ok(Some(device))
}

/// The whole property for device `D`: the guest's `reach` leads it to a
/// state, which is damaged, decoded and restored, and the guest's `after`
/// accesses follow.
fn hostile_state<D: Fuzzed>(
    memory: &[u8],
    reach: &[Op],
    damages: &[Damage],
    after: &[Op],
) -> TestCaseResult {
    let fixture = Fixture::new(memory);
    let mut reached = D::fresh(&fixture);
    reached.guest(&fixture, reach);
    let bytes = damaged(&reached.save(), damages);
    within_allocation_bound(|| {
        let Ok(state) = serde_json::from_slice::<D::State>(&bytes) else {
            return Ok(());
        };
        restore_then_guest::<D>(&fixture, &state, after).map(drop)
    })
}

/// Guest memory, the accesses before the snapshot, its damage, and the
/// accesses after the restore.
type Case = (Vec<u8>, Vec<Op>, Vec<Damage>, Vec<Op>);

fn case<D: Fuzzed>() -> impl Strategy<Value = Case> {
    (guest_bytes(), D::ops(), damages(), D::ops())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(HOSTILE_STATE_CASES))]

    #[test]
    fn pic_survives_any_saved_state((memory, reach, damages, after) in case::<Pic>()) {
        hostile_state::<Pic>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn pit_survives_any_saved_state((memory, reach, damages, after) in case::<Pit>()) {
        hostile_state::<Pit>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn cmos_survives_any_saved_state((memory, reach, damages, after) in case::<Cmos>()) {
        hostile_state::<Cmos>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn serial_survives_any_saved_state((memory, reach, damages, after) in case::<SerialPort>()) {
        hostile_state::<SerialPort>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn i8042_survives_any_saved_state((memory, reach, damages, after) in case::<I8042>()) {
        hostile_state::<I8042>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn doorbell_survives_any_saved_state((memory, reach, damages, after) in case::<Doorbell>()) {
        hostile_state::<Doorbell>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn virtio_block_survives_any_saved_state(
        (memory, reach, damages, after) in case::<MmioTransport<VirtioBlock>>(),
    ) {
        hostile_state::<MmioTransport<VirtioBlock>>(&memory, &reach, &damages, &after)?;
    }

    #[test]
    fn virtio_console_survives_any_saved_state(
        (memory, reach, damages, after) in case::<MmioTransport<VirtioConsole>>(),
    ) {
        hostile_state::<MmioTransport<VirtioConsole>>(&memory, &reach, &damages, &after)?;
    }
}
