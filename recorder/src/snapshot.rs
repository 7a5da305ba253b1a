//! A snapshot's bytes, as the trace and the snapshot cache store them:
//!
//! ```text
//! state length u32 LE | state (JSON) | zstd(run*)
//! run: guest physical address u64 LE | length u64 LE | bytes
//! ```
//!
//! Only non-zero memory is stored (see `MemoryImage`), and it is compressed.

use std::io::{Read, Write};

use provm_vmm::memory::MemoryImage;
use provm_vmm::vm::VmSnapshot;

/// zstd's level for snapshots: fast; memory pages compress well anyway.
const LEVEL: i32 = 3;

pub fn encode(snapshot: &VmSnapshot) -> Vec<u8> {
    let state = serde_json::to_vec(&snapshot.state).expect("the VM state serialises");
    let mut out = Vec::with_capacity(state.len() + 4);
    out.extend_from_slice(&(state.len() as u32).to_le_bytes());
    out.extend_from_slice(&state);
    let mut memory = zstd::Encoder::new(out, LEVEL).expect("zstd accepts its own level");
    for (address, bytes) in &snapshot.memory.runs {
        memory
            .write_all(&address.to_le_bytes())
            .and_then(|()| memory.write_all(&(bytes.len() as u64).to_le_bytes()))
            .and_then(|()| memory.write_all(bytes))
            .expect("writing to memory cannot fail");
    }
    memory.finish().expect("writing to memory cannot fail")
}

/// Decodes what `encode` wrote; `memory_limit` bounds the runs' addresses
/// (the guest's RAM size), so a corrupt length cannot exhaust host memory.
pub fn decode(bytes: &[u8], memory_limit: u64) -> Result<VmSnapshot, String> {
    let (length, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or("too short for a snapshot")?;
    let length = u32::from_le_bytes(*length) as usize;
    if length > rest.len() {
        return Err("the VM state runs past the end".into());
    }
    let state = serde_json::from_slice(&rest[..length])
        .map_err(|e| format!("the VM state is not readable: {e}"))?;
    let mut memory = zstd::Decoder::new(&rest[length..])
        .map_err(|e| format!("the memory image is not readable: {e}"))?;
    let mut runs = Vec::new();
    loop {
        let mut head = [0u8; 16];
        match memory.read(&mut head[..1]) {
            Ok(0) => break,
            Ok(_) => memory
                .read_exact(&mut head[1..])
                .map_err(|e| format!("the memory image is truncated: {e}"))?,
            Err(e) => return Err(format!("the memory image is not readable: {e}")),
        }
        let address = u64::from_le_bytes(head[..8].try_into().unwrap());
        let len = u64::from_le_bytes(head[8..].try_into().unwrap());
        if address
            .checked_add(len)
            .is_none_or(|end| end > memory_limit)
        {
            return Err(format!(
                "a memory run at {address:#x} of {len} bytes lies outside the guest's RAM"
            ));
        }
        let mut run = vec![0; len as usize];
        memory
            .read_exact(&mut run)
            .map_err(|e| format!("the memory image is truncated: {e}"))?;
        runs.push((address, run));
    }
    Ok(VmSnapshot {
        state,
        memory: MemoryImage { runs },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // A snapshot is checksummed before it is decoded; this is the second
        // line: arbitrary bytes give an error, never a panic or a huge
        // allocation.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes, 1 << 20);
        }
    }
}
