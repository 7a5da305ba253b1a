//! The record/replay seam: the one place every input the guest receives and
//! every output it produces crosses the VMM.
//!
//! The VMM calls a [`Seam`] at each VM exit (what the guest did, what a read
//! returned), for each clock reading, interrupt injection, agent-channel
//! input and disk write. It knows nothing of traces: a recorder logs what it
//! is told and answers the clock from the host; a replayer answers the clock
//! from its log and compares everything else with it.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::{Clock, HostClock};
use crate::disk::Disk;
use crate::network::{HostNetwork, Network};
use crate::state_digest::{MemoryDigest, StateDigest};
pub use crate::vcpu::Place;

/// Why `Vm::run` stopped when the seam said the host's input is due.
pub const HOST_INPUT_DUE: &str = "the host's input for the guest agent is due";

/// What the guest did to cause a VM exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit<'a> {
    /// `len` bytes read from `port`: one access, or the several accesses of
    /// a string instruction (`rep ins`) that KVM handed over at one exit.
    PioRead {
        port: u16,
        len: u16,
    },
    /// Bytes written to `port`, by one access or a string instruction's.
    PioWrite {
        port: u16,
        data: &'a [u8],
    },
    MmioRead {
        address: u64,
        len: u8,
    },
    MmioWrite {
        address: u64,
        data: &'a [u8],
    },
    Halt,
    /// The guest became able to take the interrupt the VMM has waiting.
    InterruptWindow,
    /// RDMSR of an MSR the VMM answers (`crate::msr`); `read_result` has
    /// the value, 8 bytes little-endian.
    MsrRead {
        index: u32,
    },
    /// Not the guest's doing: the VMM preempted it between exits, after it
    /// computed for a quantum without one (`preemption.rs`).
    Preempted(&'a Instance),
}

/// Which instance of its place a preempted guest was at: the rest of its
/// state, digested (`preemption::digest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The guest pages written since the last preemption, as runs of page
    /// numbers (first, count): every page the guest can have changed
    /// since its last exit is among them.
    pub pages: Vec<(u64, u64)>,
    /// Of the system and vector registers and of the pages' bytes.
    pub digest: u64,
    /// For a computation that may end by itself: how long the vCPU
    /// computed in the guest since its last exit, its thread's CPU time,
    /// which a replay runs freely for in part before it looks
    /// (`preemption::late_arming`). `None` for a loop that never ends.
    pub ran_ns: Option<u64>,
    /// Where the guest stood in user mode: the guest physical address of
    /// the instruction at the place, where a replay on a host that stops
    /// user mode at no breakpoint writes its `int3` (`user_trap`). Its
    /// state is then digested without the frame of the kernel's last entry
    /// from user mode (`preemption::digest`). `None` in the kernel, and in
    /// traces of format 13 and before, which digested that frame.
    pub user_code: Option<u64>,
}

/// Where a replay must run the guest to, for an exit that KVM does not
/// make again by itself: a breakpoint on the place's RIP, and the stop
/// where the state is the logged one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoggedStop {
    /// The interrupt-window exit of a `Delivery::WindowExit` recording.
    Window(Place),
    /// A preemption, at this instance of its place.
    Preemption(Place, Instance),
}

impl LoggedStop {
    pub fn place(&self) -> Place {
        match self {
            LoggedStop::Window(place) | LoggedStop::Preemption(place, _) => *place,
        }
    }
}

/// Where the VMM may deliver an interrupt: a timer tick falls due at any
/// instruction, but an arbitrary instruction cannot be found again without
/// an instruction counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Anywhere: the vCPU is kicked out of the guest when a tick falls due,
    /// and KVM's interrupt-window exit is asked for. Nothing replays a live
    /// run.
    Anywhere,
    /// At VM exits only; where the guest has interrupts off then, at KVM's
    /// interrupt-window exit. Recordings of earlier provm versions on SVM
    /// hosts delivered so (and forks of them go on so); where KVM places
    /// that exit differs between kernels (`interrupt_window`), so a new
    /// recording rings the doorbell instead.
    WindowExit,
    /// The replay of a `WindowExit` recording: where the log says the
    /// next exit is an interrupt window, the guest runs to the logged place
    /// (a hardware breakpoint on its RIP, taken where the registers match
    /// too) and that stop stands for the window exit. No window is asked
    /// of KVM, so the replay does not depend on where this host's KVM
    /// would place it.
    LoggedWindow,
    /// At VM exits only; where the guest has interrupts off then, at the
    /// exit the guest kernel makes when it finds its doorbell rung (kernel
    /// patch 0007). Every host.
    Doorbell,
}

impl Delivery {
    /// Whether the VMM may interrupt the guest between exits.
    pub fn preemptive(self) -> bool {
        self == Delivery::Anywhere
    }
}

pub trait Seam: Clock {
    /// Where the VMM may deliver interrupts: a recorder and a replayer
    /// deliver at exits, as the trace says (`Delivery`).
    fn delivery(&self) -> Delivery;

    /// Where the guest must stop next, if the seam knows of an exit there
    /// that KVM does not make by itself: a replay whose log's next exit is
    /// a preemption, or an interrupt window of a `LoggedWindow` replay.
    fn logged_stop(&self) -> Option<LoggedStop> {
        None
    }

    /// After how long without an exit the recorder preempts the guest
    /// (`preemption.rs`), if it does: only a recorder does.
    fn preemption_quantum(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether the recorder preempts a computation that may end too, not
    /// only a loop that never does (`preemption::late_arming`).
    fn preempts_computations(&self) -> bool {
        false
    }

    /// The guest halted until the virtual clock reaches `ns`: wait for it, but
    /// not past `limit`. A replayer returns at once (its clock is the log).
    fn wait_until(&self, ns: u64, limit: Instant);

    /// A VM exit, before the device handles it, and where the guest was.
    fn exit(&self, exit: Exit<'_>, at: Place);

    /// What the device returned for the read of the exit just reported.
    fn read_result(&self, data: &[u8]);

    /// An external interrupt vector was injected.
    fn injected(&self, vector: u8);

    /// With more than one vCPU, after an exit: `proposed` is the vCPU the
    /// scheduler would switch to (None: the running one goes on); returns
    /// the one to switch to. A recording logs each switch; a replay
    /// switches where the recording did, whatever is proposed.
    fn schedule(&self, proposed: Option<usize>) -> Option<usize> {
        proposed
    }

    /// Bytes the host sent to the guest agent.
    fn agent_input(&self, bytes: &[u8]);

    /// Bytes the guest agent sent to the host.
    fn agent_output(&self, bytes: &[u8]);

    /// The guest wrote `data` at byte `offset` of its disk.
    fn disk_write(&self, offset: u64, data: &[u8]);

    /// The guest's network card sent an Ethernet frame.
    fn net_send(&self, _frame: &[u8]) {}

    /// A frame for the guest's network card, if one is there now. Asked
    /// right after a VM exit, while the card has a receive buffer posted:
    /// a recorder takes it from its network and logs it, a replayer takes
    /// it from the log where the recording received one.
    fn net_receive(&self) -> Option<Vec<u8>> {
        None
    }

    /// Like `wait_until`, for a guest whose network card could take a
    /// frame now: a seam with a network ends the wait early when one
    /// arrives.
    fn wait_for_frame_until(&self, ns: u64, limit: Instant) {
        self.wait_until(ns, limit);
    }

    /// Why the run must stop now, if it must: a replay diverged, or the user
    /// interrupted a recording.
    fn stop_reason(&self) -> Option<String>;

    /// A replay put the guest back where its stretch without exits began
    /// (a late search's rollback, `preemption::late_arming`): what it ran
    /// since was undone, and is not the guest going without exits. A
    /// replayer times its exitless limit afresh, so that the search from
    /// the stretch's start has all of it.
    fn rolled_back(&self) {}

    /// A replay's guest stopped at the place of the logged stop it runs to
    /// (`logged_stop`) in another state: a search under way, not a guest
    /// going without exits. A replayer times its exitless limit afresh,
    /// within a bound for the whole search, so that a search whose stops
    /// are slow (an emulated CPU) is not taken for a spin.
    fn passed_logged_stop(&self) {}

    /// Whether the host has input for the guest agent now, so that the run
    /// stops for it to be sent (`HOST_INPUT_DUE`). Asked right after an
    /// exit only, never at a kick, which a replay does not meet again: a
    /// recorder or a live run says so while a signal for the command is
    /// due, a replayer where the log has the host's input next.
    fn host_input_due(&self) -> bool {
        false
    }

    /// Whether the disk access about to be made (a read or a `write` of up
    /// to 64 KiB of a request) fails, a fault injected into a fork of a
    /// replay: the request completes with an I/O error, and a write that
    /// fails is no disk write.
    fn disk_access_fails(&self, _write: bool) -> bool {
        false
    }

    /// Whether `Vm::run` should return `VmEvent::Paused` now, at the
    /// boundary after a VM exit where the VM can be snapshotted and later
    /// restored to go on exactly as from here (a replay's time-travel
    /// snapshots). Asked once per exit; true once per request.
    fn pause_here(&self) -> bool {
        false
    }

    /// Whether to check guest memory here, right after a VM exit: `Vm::run`
    /// then hands its digest to `memory_checked`. A recorder says when
    /// (every so many events); a replayer checks where its log did. Asked
    /// once per pass of the run loop at an exit, before `pause_here`.
    fn memory_check_due(&self) -> bool {
        false
    }

    /// The digest of all guest memory (`state_digest::memory`) at a check
    /// `memory_check_due` asked for.
    fn memory_checked(&self, _digest: MemoryDigest) {}

    /// Whether to digest the whole machine when the guest powers off: `Vm::run`
    /// then hands it to `final_state` before returning `VmEvent::Halted`.
    fn final_check_due(&self) -> bool {
        false
    }

    /// The machine's state when the guest powered off.
    fn final_state(&self, _digest: &StateDigest) {}

    /// Host time spent logging so far, in nanoseconds: the seam's own cost,
    /// which exit timing reports apart from the VMM's (0: logs nothing).
    fn logging_ns(&self) -> u64 {
        0
    }
}

/// Whether the host has input for a live run's guest agent now (see
/// `Seam::host_input_due`).
pub type HostInputDue = Box<dyn Fn() -> bool + Send + Sync>;

/// The seam of a plain run: host time, ticks whenever they are due, nothing
/// logged.
pub struct LiveSeam {
    clock: HostClock,
    network: Option<HostNetwork>,
    host_input: Option<HostInputDue>,
}

impl LiveSeam {
    /// A seam whose monotonic clock starts at `start_ns` (a restored
    /// snapshot's time, or 0 for a fresh boot).
    pub fn starting_at(start_ns: u64) -> Self {
        LiveSeam {
            clock: HostClock::starting_at(start_ns),
            network: None,
            host_input: None,
        }
    }

    /// The run stops right after an exit while `due` says the host has
    /// input for the agent (a signal for the command), as a recording's
    /// does.
    pub fn with_host_input(mut self, due: HostInputDue) -> Self {
        self.host_input = Some(due);
        self
    }

    /// The guest's network card is connected to `network`.
    pub fn with_network(mut self, network: Box<dyn Network>) -> Self {
        self.network = Some(HostNetwork::new(network));
        self
    }
}

impl Clock for LiveSeam {
    fn monotonic_ns(&self) -> u64 {
        self.clock.monotonic_ns()
    }

    fn wall_ns(&self) -> u64 {
        self.clock.wall_ns()
    }
}

impl Seam for LiveSeam {
    fn delivery(&self) -> Delivery {
        Delivery::Anywhere
    }

    fn wait_until(&self, ns: u64, limit: Instant) {
        self.clock.sleep_until(ns, limit);
    }

    fn exit(&self, _: Exit<'_>, _: Place) {}
    fn read_result(&self, _: &[u8]) {}
    fn injected(&self, _: u8) {}
    fn agent_input(&self, _: &[u8]) {}
    fn agent_output(&self, _: &[u8]) {}
    fn disk_write(&self, _: u64, _: &[u8]) {}

    fn net_send(&self, frame: &[u8]) {
        if let Some(network) = &self.network {
            network.send(frame);
        }
    }

    fn net_receive(&self) -> Option<Vec<u8>> {
        self.network.as_ref()?.receive()
    }

    fn wait_for_frame_until(&self, ns: u64, limit: Instant) {
        match &self.network {
            Some(network) => network.wait(&self.clock, ns, limit),
            None => self.clock.sleep_until(ns, limit),
        }
    }

    fn stop_reason(&self) -> Option<String> {
        None
    }

    fn host_input_due(&self) -> bool {
        self.host_input.as_ref().is_some_and(|due| due())
    }
}

/// A disk whose writes are reported to the seam: they are guest outputs.
pub(crate) struct ObservedDisk {
    pub disk: Box<dyn Disk>,
    pub seam: Arc<dyn Seam>,
}

impl Disk for ObservedDisk {
    fn size(&self) -> u64 {
        self.disk.size()
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.seam.disk_access_fails(false) {
            return Err(injected_error());
        }
        self.disk.read_at(offset, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.seam.disk_access_fails(true) {
            return Err(injected_error());
        }
        self.seam.disk_write(offset, buf);
        self.disk.write_at(offset, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.disk.flush()
    }
}

fn injected_error() -> io::Error {
    io::Error::other("an injected disk error")
}
