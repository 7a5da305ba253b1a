//! Whether this host's interrupt-window exit can place an interrupt where a
//! replay finds it again.
//!
//! With no in-kernel irqchip, a VMM that holds an interrupt the guest cannot
//! take (interrupts disabled) asks KVM for an exit when it can
//! (`request_interrupt_window`). On SVM (measured on the test bed) and VMX
//! (the SDM's interrupt-window exiting: the exit comes before the first
//! instruction with RFLAGS.IF set and no STI or MOV SS blocking) that exit
//! lands where the guest's own execution enables interrupts: after the
//! instruction in STI's shadow. PVM reports it either side of STI;HLT, from
//! one run to the next (measured), so a recording there waits at the guest
//! kernel's doorbell instead (kernel patch 0007), an exit the guest makes
//! itself. `probe` runs that sequence and a plain STI a few times and takes
//! the window only where every run exits at the one right place.

use std::sync::OnceLock;

use kvm_ioctls::{Kvm, VcpuExit};

use crate::code_guest::{probe_once, CodeGuest, CODE};
use crate::cpuid::Platform;
use crate::vcpu::VcpuError;

/// 32-bit code: with interrupts off, exit (where the VMM asks for the
/// window), enable them, run one instruction in STI's shadow and one
/// after: `cli; out 0x80, al; sti; nop; nop; hlt`.
const STI_NOP: &[u8] = &[0xfa, 0xe6, 0x80, 0xfb, 0x90, 0x90, 0xf4];
/// Where the window opens in `STI_NOP`: the second NOP.
const STI_NOP_WINDOW: u64 = 5;
/// The same with a HLT in the shadow: `cli; out 0x80, al; sti; hlt`. The
/// HLT exits first (KVM reports HLT to a VMM without an in-kernel irqchip),
/// past the HLT.
const STI_HLT: &[u8] = &[0xfa, 0xe6, 0x80, 0xfb, 0xf4];
const STI_HLT_EXIT: u64 = 5;

/// How often each sequence runs: PVM's two answers each came up in a few
/// runs.
const RUNS: usize = 8;

/// Whether interrupt-window exits on this host land where the guest
/// enables interrupts, every time: probed once per process, and never on
/// PVM, whose windows are known to move.
pub fn exact_here(kvm: &Kvm) -> Result<bool, VcpuError> {
    static PROBED: OnceLock<bool> = OnceLock::new();
    probe_once(&PROBED, || {
        Ok(Platform::detect() == Platform::Hardware && probe(kvm)?)
    })
}

fn probe(kvm: &Kvm) -> Result<bool, VcpuError> {
    for _ in 0..RUNS {
        if window_exit(kvm, STI_NOP)? != (WindowExit::Window, CODE.0 + STI_NOP_WINDOW)
            || window_exit(kvm, STI_HLT)? != (WindowExit::Halt, CODE.0 + STI_HLT_EXIT)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

#[derive(Debug, PartialEq, Eq)]
enum WindowExit {
    Window,
    Halt,
    Other,
}

/// Runs `code` to its OUT, asks for the interrupt window there, and
/// returns the next exit and where it left RIP.
fn window_exit(kvm: &Kvm, code: &[u8]) -> Result<(WindowExit, u64), VcpuError> {
    let mut guest = CodeGuest::new(kvm, code, false)?;
    let exit = guest.vcpu.fd.run().map_err(VcpuError::Probe)?;
    if !matches!(exit, VcpuExit::IoOut(0x80, _)) {
        return Err(VcpuError::ProbeExit(format!("{exit:?}")));
    }
    guest.vcpu.request_interrupt_window(true);
    let exit = match guest.vcpu.fd.run().map_err(VcpuError::Probe)? {
        VcpuExit::IrqWindowOpen => WindowExit::Window,
        VcpuExit::Hlt => WindowExit::Halt,
        _ => WindowExit::Other,
    };
    let rip = guest.vcpu.fd.get_regs().map_err(VcpuError::Probe)?.rip;
    Ok((exit, rip))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SVM's window is exact (and VMX's, by the SDM); PVM's is not used.
    #[test]
    fn this_hosts_interrupt_window_is_used_where_it_is_exact() {
        let kvm = Kvm::new().unwrap();
        let expected = Platform::detect() == Platform::Hardware;
        assert_eq!(exact_here(&kvm).unwrap(), expected);
    }

    /// The probe itself, without the platform's shortcut: on PVM
    /// `sti; nop; nop` gets no window at the place the SDM gives (it runs on
    /// to its HLT), on SVM it does every time.
    #[test]
    fn the_probe_finds_the_window_exact_only_on_hardware() {
        let kvm = Kvm::new().unwrap();
        let answers: Vec<_> = (0..RUNS)
            .map(|_| window_exit(&kvm, STI_NOP).unwrap())
            .collect();
        eprintln!("sti; nop; nop with the window asked for: {answers:?}");
        let hardware = Platform::detect() == Platform::Hardware;
        assert_eq!(probe(&kvm).unwrap(), hardware, "{answers:?}");
    }
}
