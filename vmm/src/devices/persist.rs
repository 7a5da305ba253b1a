//! Saving and restoring a device (Firecracker's `Persist`, in the form that
//! fits devices already wired into the VM: restore puts a state back into
//! them).
//!
//! A snapshot is input the VMM did not produce: it may be damaged or
//! crafted. Restore therefore checks every field against what the device
//! itself could ever reach, and refuses a state that breaks an invariant,
//! naming the field, instead of repairing it or panicking on it later.

use std::fmt::Display;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A device whose state a snapshot carries. Its `State` is part of the
/// machine version (`crate::machine_version`): changing its fields or what
/// one means is a new machine version. A `State` refuses fields it does not
/// know (`#[serde(deny_unknown_fields)]`): a state saved by another build
/// must not restore with parts of it dropped.
pub trait Persist {
    type State: Serialize + DeserializeOwned;

    /// The device's state now.
    fn save(&self) -> Self::State;

    /// Checks all of `state`, then puts it back. On error the device is left
    /// as it was.
    fn restore(&mut self, state: &Self::State) -> Result<(), InvalidState>;
}

/// A saved state that the device could never have been in.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("saved {device} state: {field} = {value}: {problem}")]
pub struct InvalidState {
    pub device: &'static str,
    /// Which field, e.g. `counters[1].mode`.
    pub field: String,
    pub value: String,
    pub problem: String,
}

impl InvalidState {
    pub fn new(
        device: &'static str,
        field: impl Into<String>,
        value: impl Display,
        problem: impl Into<String>,
    ) -> Self {
        Self {
            device,
            field: field.into(),
            value: value.to_string(),
            problem: problem.into(),
        }
    }
}

/// Refuses `state` with `problem` unless `ok` holds.
pub fn require(
    ok: bool,
    device: &'static str,
    field: impl Into<String>,
    value: impl Display,
    problem: &str,
) -> Result<(), InvalidState> {
    if ok {
        Ok(())
    } else {
        Err(InvalidState::new(device, field, value, problem))
    }
}
