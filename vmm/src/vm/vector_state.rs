//! Acting on the guest kernel's requests to save and load a task's vector
//! state (`devices::vector_state`, kernel patch 0011): the whole XSAVE
//! area of the vCPU that asked, through KVM, into or out of the task's
//! register area in guest RAM. Kept there, the state is part of the
//! guest's memory like everything else the kernel saves at a switch.

use kvm_bindings::kvm_xsave;
use vm_memory::{Bytes, GuestAddress};

use super::{Vm, VmError};
use crate::devices::vector_state::VectorStateRequest;
use crate::vcpu;

/// Where the XSAVE header's XSTATE_BV lies: the components the area holds.
const XSTATE_BV: std::ops::Range<usize> = 512..520;
/// x87 and SSE: always in the area, whose first 512 bytes are the FXSAVE
/// area the guest kernel itself fills for a new task (and reads for
/// ptrace and signals).
const LEGACY_COMPONENTS: u64 = 0b11;

impl Vm {
    /// Acts on the vector-state request of the exit just handled, if it
    /// was one.
    pub(super) fn keep_vector_state(&mut self) -> Result<(), VmError> {
        let request = self
            .devices
            .vector_state_ports
            .lock()
            .unwrap()
            .take_request();
        let memory_error = |area: u64, error: vm_memory::GuestMemoryError| {
            VmError::UnexpectedExit(format!(
                "the guest kernel's vector-state area at {area:#x}: {error}"
            ))
        };
        match request {
            None => Ok(()),
            Some(VectorStateRequest::Save { area }) => {
                let xsave = self.vcpu.vector_registers()?;
                self.memory
                    .write_slice(vcpu::xsave_bytes(&xsave), GuestAddress(area))
                    .map_err(|error| memory_error(area, error))
            }
            Some(VectorStateRequest::Load { area }) => {
                let mut xsave = kvm_xsave::default();
                self.memory
                    .read_slice(vcpu::xsave_bytes_mut(&mut xsave), GuestAddress(area))
                    .map_err(|error| memory_error(area, error))?;
                with_legacy_components(vcpu::xsave_bytes_mut(&mut xsave));
                Ok(self.vcpu.set_vector_registers(&xsave)?)
            }
        }
    }
}

/// Marks x87 and SSE as held in `area`, whose first 512 bytes the kernel
/// may have written itself: a new task's area has an empty header, and
/// ptrace or a signal's return may change registers the header says are
/// in their initial state. Loaded as it is, such an area would put them
/// in their initial state instead of the kernel's.
fn with_legacy_components(area: &mut [u8]) {
    let held = u64::from_le_bytes(area[XSTATE_BV].try_into().unwrap());
    area[XSTATE_BV].copy_from_slice(&(held | LEGACY_COMPONENTS).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_area_the_kernel_filled_loads_its_x87_and_sse_state() {
        let mut area = vec![0u8; 4096];
        with_legacy_components(&mut area);
        assert_eq!(area[512], 0b11);
        area[512] = 0b110;
        with_legacy_components(&mut area);
        assert_eq!(area[XSTATE_BV], [0b111, 0, 0, 0, 0, 0, 0, 0]);
    }
}
