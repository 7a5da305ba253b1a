//! The running process's user-space backtrace at a stop, by its frame
//! pointers: from where it was in user mode, each saved RBP links to its
//! caller's frame, with the return address above it. Code built without
//! frame pointers ends the chain early (its RBP holds no frame link): a
//! caller is kept only while its return address lies in a file's mapping.

use serde::Serialize;

use crate::address_space::{AddressSpace, Region};
use crate::guest::{Guest, PT_REGS};

/// The most frames a backtrace follows.
const MAX_FRAMES: usize = 32;

/// One frame: where its code was, and the mapping that holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub address: u64,
    pub region: Region,
}

/// The backtrace of the running task, whose address space is `space`;
/// empty where its user registers cannot be read.
pub fn user_backtrace(guest: &Guest, space: &AddressSpace) -> Vec<Frame> {
    let Some((rip, mut rbp)) = user_registers(guest) else {
        return Vec::new();
    };
    let mut frames = vec![Frame {
        address: rip,
        region: space.region(rip, false),
    }];
    while frames.len() < MAX_FRAMES && rbp != 0 && rbp % 8 == 0 {
        let (Ok(caller_rbp), Ok(returns_to)) =
            (space.read_u64(guest, rbp), space.read_u64(guest, rbp + 8))
        else {
            break;
        };
        let region = space.region(returns_to, false);
        if !matches!(region, Region::File { .. } | Region::FileCopy { .. }) {
            break;
        }
        frames.push(Frame {
            address: returns_to,
            region,
        });
        // The stack grows down: a caller's frame lies above its callee's.
        if caller_rbp <= rbp {
            break;
        }
        rbp = caller_rbp;
    }
    frames
}

/// The running task's RIP and RBP in user mode: the vCPU's own if it is
/// in user mode, else those the kernel saved when the task entered it.
fn user_registers(guest: &Guest) -> Option<(u64, u64)> {
    if guest.view.sregs.cs.dpl == 3 {
        return Some((guest.view.regs.rip, guest.view.regs.rbp));
    }
    let saved = guest.saved_user_regs().ok()?;
    if !saved.from_user_mode() {
        return None;
    }
    let value = |name| {
        let at = PT_REGS.iter().position(|&reg| reg == name)?;
        Some(saved.values[at])
    };
    Some((value("rip")?, value("rbp")?))
}
