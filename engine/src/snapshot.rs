//! The VM's snapshot in the trace's snapshot encoding (`provm_trace::snapshot`),
//! which knows the VM's state only as serialised JSON.

use provm_trace::snapshot::{self, SnapshotError};
use provm_vmm::memory::MemoryImage;
use provm_vmm::vm::{VmSnapshot, VmState};

pub fn encode(snapshot: &VmSnapshot) -> Vec<u8> {
    snapshot::encode(&snapshot.state, &snapshot.memory.runs)
}

/// Decodes a snapshot of a guest of `memory_mib` MiB on machine version
/// `machine`, which names the state's schema in errors: the state refuses
/// a field it does not know (the snapshot of another build of provm)
/// rather than restore without it.
pub fn decode(bytes: &[u8], memory_mib: u64, machine: u32) -> Result<VmSnapshot, SnapshotError> {
    let decoded =
        snapshot::decode::<VmState>(bytes, memory_mib).map_err(|e| of_machine(e, machine))?;
    Ok(VmSnapshot {
        state: decoded.state,
        memory: MemoryImage { runs: decoded.runs },
    })
}

/// The state alone, its memory left compressed: what a reader of a trace
/// needs of its snapshot (which vCPU runs first, the clock's reading).
pub fn state(bytes: &[u8], machine: u32) -> Result<VmState, SnapshotError> {
    snapshot::decode_state::<VmState>(bytes).map_err(|e| of_machine(e, machine))
}

/// A state that does not parse names the machine version it was read as.
fn of_machine(error: SnapshotError, machine: u32) -> SnapshotError {
    match error {
        SnapshotError::State(source) => SnapshotError::MachineState { machine, source },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VM state saved by provm at 242a0b3 (machine version 1).
    const STATE: &[u8] = include_bytes!("../../tests/data/golden/vm-state.machine-1.json");

    /// The state, with a field named `extra` added to the PIT's.
    fn snapshot_with_pit_field(extra: Option<&str>) -> Vec<u8> {
        let mut state: serde_json::Value = serde_json::from_slice(STATE).unwrap();
        if let Some(name) = extra {
            state["pit"][name] = serde_json::json!(7);
        }
        snapshot::encode(&state, &[])
    }

    #[test]
    fn a_state_with_a_field_this_provm_does_not_know_is_refused_by_name() {
        assert!(decode(&snapshot_with_pit_field(None), 64, 1).is_ok());
        let refused = decode(
            &snapshot_with_pit_field(Some("latch_of_a_newer_build")),
            64,
            1,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            refused.contains("unknown field `latch_of_a_newer_build`"),
            "{refused}"
        );
        assert!(refused.contains("machine version 1"), "{refused}");
    }
}
