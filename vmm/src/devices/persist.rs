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

/// The version of the VM state a snapshot carries: every `Persist::State`,
/// `VcpuState` and `VmState`. Bump it with any change to their fields or to
/// what a field means, so that cached snapshots of the old layout are not
/// restored into the new devices (the snapshot cache is keyed on it).
pub const DEVICE_MODEL_VERSION: u32 = 2;

/// A device whose state a snapshot carries. Changing a `State`: bump
/// `DEVICE_MODEL_VERSION`.
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
