//! The VM's snapshot in the trace's snapshot encoding (`provm_trace::snapshot`),
//! which knows the VM's state only as serialised JSON.

use provm_trace::snapshot::{self, SnapshotError};
use provm_vmm::memory::MemoryImage;
use provm_vmm::vm::{VmSnapshot, VmState};

pub fn encode(snapshot: &VmSnapshot) -> Vec<u8> {
    snapshot::encode(&snapshot.state, &snapshot.memory.runs)
}

/// Decodes a snapshot of a guest of `memory_mib` MiB.
pub fn decode(bytes: &[u8], memory_mib: u64) -> Result<VmSnapshot, SnapshotError> {
    let decoded = snapshot::decode::<VmState>(bytes, memory_mib)?;
    Ok(VmSnapshot {
        state: decoded.state,
        memory: MemoryImage { runs: decoded.runs },
    })
}
