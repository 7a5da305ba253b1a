//! The VMM's side of kernel patch 0011 (kernels/patches): the guest
//! kernel's requests to save and load a task's vector state, which it
//! cannot itself where the hypervisor runs user mode with more of it than
//! the kernel knows (PVM: AVX and AVX-512 beside a kernel without XSAVE).
//! The VM acts on a request right after its exit (`Vm::keep_vector_state`),
//! with KVM_GET_XSAVE and KVM_SET_XSAVE on the vCPU that asked.

use crate::bus::BusDevice;

/// The ports, from their base: a 4-byte write at 0 asks to save, at 4 to
/// load, each of a register area whose guest-physical address the value
/// gives, shifted right by `AREA_ALIGNMENT_BITS`.
pub const VECTOR_STATE_PORT: u16 = 0x450;
pub const VECTOR_STATE_PORT_LEN: u64 = 8;
const SAVE: u64 = 0;
const LOAD: u64 = 4;
/// A register area is 64-byte aligned (the kernel's `struct fpstate`), so
/// 32 bits of its address shifted right by 6 reach 256 GiB of RAM.
const AREA_ALIGNMENT_BITS: u32 = 6;

/// What the guest kernel asked for at the ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorStateRequest {
    /// Save the vCPU's XSAVE area into the register area at `area`.
    Save { area: u64 },
    /// Load the vCPU's XSAVE area from the register area at `area`.
    Load { area: u64 },
}

#[derive(Default)]
pub struct VectorStatePorts {
    request: Option<VectorStateRequest>,
}

impl VectorStatePorts {
    /// The request of the exit just handled, if it was one.
    pub fn take_request(&mut self) -> Option<VectorStateRequest> {
        self.request.take()
    }
}

impl BusDevice for VectorStatePorts {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let &[a, b, c, d] = data else {
            tracing::warn!(offset, len = data.len(), "vector state port: write ignored");
            return;
        };
        let area = u64::from(u32::from_le_bytes([a, b, c, d])) << AREA_ALIGNMENT_BITS;
        self.request = match offset {
            SAVE => Some(VectorStateRequest::Save { area }),
            LOAD => Some(VectorStateRequest::Load { area }),
            _ => {
                tracing::warn!(offset, "vector state port: write ignored");
                None
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_names_the_area_by_its_address_shifted_right_by_six() {
        let mut ports = VectorStatePorts::default();
        ports.write(SAVE, &0x0123_4567u32.to_le_bytes());
        assert_eq!(
            ports.take_request(),
            Some(VectorStateRequest::Save {
                area: 0x0123_4567 << 6
            })
        );
        assert_eq!(ports.take_request(), None);
        ports.write(LOAD, &1u32.to_le_bytes());
        assert_eq!(
            ports.take_request(),
            Some(VectorStateRequest::Load { area: 64 })
        );
    }

    #[test]
    fn other_writes_ask_nothing() {
        let mut ports = VectorStatePorts::default();
        ports.write(SAVE, &[1, 2]);
        ports.write(2, &1u32.to_le_bytes());
        assert_eq!(ports.take_request(), None);
    }
}
