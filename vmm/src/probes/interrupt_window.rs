//! Where this host's KVM places the interrupt-window exit: a fact about
//! the host, measured, and no longer one provm depends on.
//!
//! With no in-kernel irqchip, a VMM that holds an interrupt the guest cannot
//! take (interrupts disabled) can ask KVM for an exit when it can
//! (`request_interrupt_window`). On SVM (measured on the test bed) and VMX
//! (the SDM's interrupt-window exiting: the exit comes before the first
//! instruction with RFLAGS.IF set and no STI or MOV SS blocking) that exit
//! usually lands where the guest's own execution enables interrupts: after
//! the instruction in STI's shadow. But not always where another kernel
//! puts it: a trace recorded on SVM with Linux 6.12 found its first window
//! six bytes earlier on 6.1, and this probe, which once decided how provm
//! recorded, gave 6.1 another verdict from one run to the next. PVM reports
//! it either side of STI;HLT. So recordings wait at the guest kernel's
//! doorbell on every host (`provm_seams::delivery`), and replays of older
//! window recordings run to the logged place (`logged_window`).
//! `stability` reports this probe beside the ones provm uses.

use kvm_ioctls::{Kvm, VcpuExit};

use super::code_guest::{CodeGuest, CODE};
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

/// Whether both sequences exit where the SDM places the window, in one
/// run each.
pub fn exact_once(kvm: &Kvm) -> Result<bool, VcpuError> {
    Ok(
        window_exit(kvm, STI_NOP)? == (WindowExit::Window, CODE.0 + STI_NOP_WINDOW)
            && window_exit(kvm, STI_HLT)? == (WindowExit::Halt, CODE.0 + STI_HLT_EXIT),
    )
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
