//! Where RIP stands at a port-write exit, the same on every kind of KVM.
//!
//! Measured with `probe`: PVM reports a non-string OUT with RIP already past
//! the instruction, while KVM on SVM (and on VMX: `kvm_fast_pio` skips the
//! instruction only when the access completes, after user space) reports
//! the OUT itself and moves RIP on at the next KVM_RUN. IN, string I/O and
//! MMIO agree on both. A trace logs the place of every exit, so the VMM
//! reports the one convention, PVM's (every trace before this one was
//! recorded there): on a host that reports the OUT itself, the place is
//! moved past it, its length decoded from guest memory.

use std::sync::OnceLock;

use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use kvm_bindings::kvm_sregs;
use kvm_ioctls::{Kvm, VcpuExit};

use super::code_guest::{probe_once, CodeGuest, CODE};
use crate::vcpu::{Vcpu, VcpuError};

/// How this host's KVM reports RIP at a non-string OUT exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutExitRip {
    /// Past the instruction (PVM), the convention traces use.
    PastInstruction,
    /// At the instruction (VMX, SVM).
    AtInstruction,
}

/// The longest x86 instruction.
const MAX_INSTRUCTION_LEN: usize = 15;

/// 32-bit code: `out 0x80, al`, then HLT.
const PROBE_CODE: &[u8] = &[0xe6, 0x80, 0xf4];

/// This host's convention, probed once per process with a small guest.
pub fn host_convention(kvm: &Kvm) -> Result<OutExitRip, VcpuError> {
    static PROBED: OnceLock<OutExitRip> = OnceLock::new();
    probe_once(&PROBED, || probe(kvm))
}

pub(crate) fn probe(kvm: &Kvm) -> Result<OutExitRip, VcpuError> {
    let mut guest = CodeGuest::new(kvm, PROBE_CODE, false)?;
    let exit = guest.vcpu.fd.run().map_err(VcpuError::Probe)?;
    if !matches!(exit, VcpuExit::IoOut(0x80, _)) {
        return Err(VcpuError::ProbeExit(format!("{exit:?}")));
    }
    let rip = guest.vcpu.fd.get_regs().map_err(VcpuError::Probe)?.rip;
    let past = CODE.0 + PROBE_CODE.len() as u64 - 1;
    let convention = match rip {
        at if at == CODE.0 => OutExitRip::AtInstruction,
        at if at == past => OutExitRip::PastInstruction,
        other => {
            return Err(VcpuError::ProbeExit(format!(
                "an OUT at {:#x} exited at RIP {other:#x}",
                CODE.0
            )))
        }
    };
    // The decoder must find the place PVM reports, or the probe is wrong.
    if convention == OutExitRip::AtInstruction
        && guest.vcpu.place_past_out(&guest.memory)?.rip != past
    {
        return Err(VcpuError::ProbeExit(
            "the OUT instruction could not be read back from guest memory".into(),
        ));
    }
    Ok(convention)
}

/// The length of the non-string OUT instruction that starts `code`, or
/// None when `code` starts with something else (OUTS, which every KVM
/// reports at the instruction, needs no adjustment).
pub fn out_instruction_len(code: &[u8], long_mode: bool) -> Option<u64> {
    let bitness = if long_mode { 64 } else { 32 };
    let instruction = Decoder::new(bitness, code, DecoderOptions::NONE).decode();
    (instruction.mnemonic() == Mnemonic::Out).then(|| instruction.len() as u64)
}

/// The guest-linear address of the instruction at `rip`.
fn linear_rip(sregs: &kvm_sregs, rip: u64) -> u64 {
    if sregs.cs.l == 1 {
        rip // 64-bit code: CS's base is ignored
    } else {
        sregs.cs.base.wrapping_add(rip)
    }
}

const PAGE_SIZE: u64 = 4096;

impl Vcpu {
    /// The length of the OUT instruction at `rip` (see
    /// `out_instruction_len`).
    pub fn out_instruction_len(
        &self,
        memory: &crate::memory::GuestMemory,
        rip: u64,
    ) -> Option<u64> {
        let sregs = self.fd.get_sregs().ok()?;
        let code = self.instruction_bytes(memory, &sregs, rip)?;
        out_instruction_len(&code, sregs.cs.l == 1)
    }

    /// The bytes at `rip` an instruction can span (15), or as many of them
    /// as are mapped, read through the guest's own translation
    /// (KVM_TRANSLATE, so any paging mode): one translation per page they
    /// lie on, at most two.
    pub(crate) fn instruction_bytes(
        &self,
        memory: &crate::memory::GuestMemory,
        sregs: &kvm_sregs,
        rip: u64,
    ) -> Option<Vec<u8>> {
        use vm_memory::{Bytes, GuestAddress};
        let mut code = [0u8; MAX_INSTRUCTION_LEN];
        let mut read = 0;
        let mut linear = linear_rip(sregs, rip);
        while read < code.len() {
            let translation = self.fd.translate_gva(linear).ok()?;
            if translation.valid == 0 {
                break;
            }
            let on_page = (PAGE_SIZE - linear % PAGE_SIZE) as usize;
            let end = code.len().min(read + on_page);
            memory
                .read_slice(
                    &mut code[read..end],
                    GuestAddress(translation.physical_address),
                )
                .ok()?;
            linear = linear.wrapping_add((end - read) as u64);
            read = end;
        }
        Some(code[..read].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_lengths_follow_the_encoding() {
        assert_eq!(out_instruction_len(&[0xe6, 0x80], false), Some(2));
        assert_eq!(out_instruction_len(&[0xee], true), Some(1));
        assert_eq!(out_instruction_len(&[0x66, 0xef], true), Some(2));
        assert_eq!(out_instruction_len(&[0x66, 0xe7, 0x70], false), Some(3));
        // REX only in 64-bit code, where it is a prefix.
        assert_eq!(out_instruction_len(&[0x48, 0xee], true), Some(2));
        assert_eq!(out_instruction_len(&[0x48, 0xee], false), None);
        // OUTS, IN and anything else are left alone.
        assert_eq!(out_instruction_len(&[0xf3, 0x6e], true), None);
        assert_eq!(out_instruction_len(&[0xec], true), None);
        assert_eq!(out_instruction_len(&[0x90], true), None);
        assert_eq!(out_instruction_len(&[0x66; 20], true), None);
    }

    /// The OUT is read back from guest memory, here across a page boundary:
    /// `66 e7 80` (out 0x80, eax with an operand-size prefix) from the last
    /// byte of one page into the next, after NOPs to get there.
    #[test]
    fn an_out_across_a_page_boundary_is_read_from_guest_memory() {
        let at = PAGE_SIZE * 2 - 1;
        let mut code = vec![0x90; (at - CODE.0) as usize];
        code.extend_from_slice(&[0x66, 0xe7, 0x80, 0xf4]);
        let kvm = Kvm::new().unwrap();
        let mut guest = CodeGuest::new(&kvm, &code, false).unwrap();
        assert!(matches!(guest.vcpu.fd.run(), Ok(VcpuExit::IoOut(0x80, _))));
        assert_eq!(guest.vcpu.out_instruction_len(&guest.memory, at), Some(3));
        assert_eq!(guest.vcpu.out_instruction_len(&guest.memory, CODE.0), None);
    }

    /// The probe answers on this host, and the answer is the one the
    /// host kind is known for.
    #[test]
    fn this_host_reports_its_out_exits_as_measured() {
        let kvm = Kvm::new().unwrap();
        let expected = match provm_cpu_model::Platform::detect() {
            provm_cpu_model::Platform::Pvm => OutExitRip::PastInstruction,
            provm_cpu_model::Platform::Hardware => OutExitRip::AtInstruction,
        };
        assert_eq!(host_convention(&kvm).unwrap(), expected);
    }
}
