//! The event a VM exit is logged as: what the recorder writes and what the
//! replayer compares the replaying guest's exit with.

use provm_trace::events::{self, Event};
use provm_vmm::seam::{Exit, Place};

/// The event that logs `exit`, made at `at`.
pub fn exit_event(exit: Exit<'_>, at: Place) -> Event {
    let at = events::Place {
        rip: at.rip,
        registers: at.registers,
    };
    match exit {
        Exit::PioRead { port, len } => Event::PioRead { port, len, at },
        Exit::PioWrite { port, data } => Event::PioWrite {
            port,
            data: data.to_vec(),
            at,
        },
        Exit::MmioRead { address, len } => Event::MmioRead { address, len, at },
        Exit::MmioWrite { address, data } => Event::MmioWrite {
            address,
            data: data.to_vec(),
            at,
        },
        Exit::Halt => Event::Halt { at },
        Exit::InterruptWindow => Event::InterruptWindow { at },
        Exit::MsrRead { index } => Event::MsrRead { index, at },
        Exit::Preempted(instance) => Event::Preempted {
            at,
            pages: instance.pages.clone(),
            instance: instance.digest,
            ran_ns: instance.ran_ns,
            user_code: instance.user_code,
        },
    }
}
