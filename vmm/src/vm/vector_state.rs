//! Acting on the guest kernel's requests to save and load a task's vector
//! state (`devices::vector_state`, kernel patch 0011): the whole XSAVE
//! area of the vCPU that asked, through KVM, into or out of the task's
//! register area in guest RAM. Kept there, the state is part of the
//! guest's memory like everything else the kernel saves at a switch.
//!
//! So the area must hold the same bytes for the same registers, or a
//! replay's memory differs from its recording's. KVM's area does not quite:
//! its header says which components the host CPU tracked as in use (a
//! register file of zeros may or may not be), and its software bytes are
//! the host kernel's. From machine version 6 on the VMM saves the area in
//! a canonical form (`canonical_area`); a VM restored from an older
//! snapshot saves it as KVM gave it, as its recording did.

use kvm_bindings::kvm_xsave;
use vm_memory::{Bytes, GuestAddress};

use super::{Vm, VmError};
use crate::devices::vector_state::VectorStateRequest;
use crate::vcpu;

use std::ops::Range;
use std::sync::OnceLock;

/// Where the XSAVE header's XSTATE_BV lies: the components the area holds.
const XSTATE_BV: Range<usize> = 512..520;
/// The FXSAVE area's bytes for software, in which the host kernel's KVM
/// puts its own XSAVE layout (`xstate_fx_sw_bytes`); XSAVE leaves them.
const SOFTWARE_BYTES: Range<usize> = 464..512;
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
                let mut xsave = self.vcpu.vector_registers()?;
                if self.canonical_vector_areas {
                    canonical_area(vcpu::xsave_bytes_mut(&mut xsave));
                }
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
    hold(area, held(area) | LEGACY_COMPONENTS);
}

/// The components `area`'s header says it holds (XSTATE_BV).
fn held(area: &[u8]) -> u64 {
    u64::from_le_bytes(area[XSTATE_BV].try_into().unwrap())
}

/// Sets `area`'s header to hold `components`.
fn hold(area: &mut [u8], components: u64) {
    area[XSTATE_BV].copy_from_slice(&components.to_le_bytes());
}

/// Makes `area`, as KVM_GET_XSAVE gave it, the same bytes for the same
/// registers on any host: the software bytes zeroed, as the guest's own
/// XSAVE would leave them, and a header that marks x87 and SSE held and
/// each later component held where its bytes are not its initial state
/// (zeros, for every component from AVX on). KVM writes a component's
/// initial state where its header bit is clear, so only the header and the
/// software bytes tell the host's tracking apart.
fn canonical_area(area: &mut [u8]) {
    area[SOFTWARE_BYTES].fill(0);
    let mut canonical = held(area) | LEGACY_COMPONENTS;
    for (component, place) in standard_places() {
        let in_initial_state = area
            .get(place.clone())
            .is_some_and(|bytes| bytes.iter().all(|&byte| byte == 0));
        if in_initial_state {
            canonical &= !(1 << component);
        }
    }
    hold(area, canonical);
}

/// Where each user component from AVX (2) on lies in XSAVE's standard
/// form, as this host's CPUID leaf 0xD gives it (the layout KVM's area
/// has): the component's number and its bytes.
fn standard_places() -> &'static [(u32, Range<usize>)] {
    static PLACES: OnceLock<Vec<(u32, Range<usize>)>> = OnceLock::new();
    PLACES.get_or_init(|| {
        // Leaf 0xD's sub-leaves read as zeros where a component is not.
        let supported = std::arch::x86_64::__cpuid_count(0xd, 0);
        let user = u64::from(supported.eax) | u64::from(supported.edx) << 32;
        (2..64)
            .filter(|component| user & (1 << component) != 0)
            .filter_map(|component| {
                let leaf = std::arch::x86_64::__cpuid_count(0xd, component);
                let (size, offset) = (leaf.eax as usize, leaf.ebx as usize);
                (size > 0).then_some((component, offset..offset + size))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same registers, tracked as in use or not: the same bytes.
    #[test]
    fn a_canonical_area_does_not_show_what_the_host_tracked() {
        let mut tracked = vec![0u8; 4096];
        tracked[XSTATE_BV.start] = 0b10;
        tracked[SOFTWARE_BYTES.start + 16] = 0xe7;
        let mut untracked = vec![0u8; 4096];
        canonical_area(&mut tracked);
        canonical_area(&mut untracked);
        assert_eq!(tracked, untracked);
        assert_eq!(tracked[XSTATE_BV], [0b11, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// A component from AVX on is held where its bytes are not zeros, as
    /// far as this host's CPU has it.
    #[test]
    fn a_component_is_held_where_its_bytes_are_not_its_initial_state() {
        let (component, place) = standard_places()
            .first()
            .cloned()
            .expect("this host's CPU has AVX");
        let mut area = vec![0u8; 4096];
        hold(&mut area, 1 << component);
        canonical_area(&mut area);
        assert_eq!(held(&area), LEGACY_COMPONENTS);
        hold(&mut area, 1 << component);
        area[place.start] = 1;
        canonical_area(&mut area);
        assert_eq!(held(&area), LEGACY_COMPONENTS | 1 << component);
    }

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
