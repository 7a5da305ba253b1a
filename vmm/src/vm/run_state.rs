//! What the run loop keeps from one entry into the guest to the next:
//! where the guest last exited and how long it has run since, what the
//! kicks of a stretch without exits found, and a recording's preemptions.
//! Apart from the devices and the stepping state, which the loop drives
//! but does not own.

use std::time::{Duration, Instant};

use provm_cpu_model::Platform;

use crate::preemption;
use crate::spin_watch::SpinWatch;

use super::late_arming::{LateSearch, LateSearches};

/// The run loop's own state (`Vm::run`, `Vm::run_once` and the exit
/// handlers').
pub(super) struct RunState {
    /// When the seam is not preemptive, the longest the guest may run
    /// without a VM exit while a timer tick waits (`VmConfig`).
    pub(super) exitless_limit: Option<Duration>,
    /// Whether the last KVM_RUN ended in a VM exit (not a kick): the points
    /// at which a non-preemptive VM may inject interrupts.
    pub(super) at_exit: bool,
    /// When the guest last exited (host time), to notice a spinning guest.
    pub(super) last_exit: Instant,
    /// Whether the current stretch without exits was reported already.
    pub(super) exitless_warned: bool,
    /// Where the guest was at the kicks of the current stretch.
    pub(super) spin_watch: SpinWatch,
    /// Whether KVM logs the pages the guest writes, for the preemptions
    /// of a recording (`preemption`).
    pub(super) logging_written_pages: bool,
    /// The pages written since the last preemption, as gathered so far.
    pub(super) written: preemption::WrittenPages,
    /// The states the kicks of this stretch found the guest in.
    pub(super) repeats: preemption::Repeats,
    /// Whether this host's KVM stops guest user mode at a breakpoint, so
    /// that a replay finds a preemption there (not PVM's: `guest_debug`).
    pub(super) user_mode_stops: bool,
    /// The last exit was a preemption: the vCPU gives way to the others.
    pub(super) preempted: bool,
    /// A chaos recording's: each stretch's quantum of preemption.
    pub(super) chaos_quanta: Option<preemption::chaos_quanta::ChaosQuanta>,
    /// A recording's: the vCPU thread's time in the guest since the last
    /// exit, where it may preempt (`Instance::ran_ns`).
    pub(super) computed_ns: u64,
    /// A replay's: RAM as it was at the start of the last late search,
    /// from the first one on (`preemption::rollback`).
    pub(super) shadow: Option<preemption::rollback::Shadow>,
    /// The late search under way, if any (`preemption::late_arming`).
    pub(super) late: Option<LateSearch>,
    /// What the late searches of this run did.
    pub(super) late_searches: LateSearches,
}

impl RunState {
    /// As at an exit, before the first entry: a restored snapshot goes on
    /// as from one.
    pub(super) fn new(exitless_limit: Option<Duration>) -> Self {
        RunState {
            exitless_limit,
            at_exit: true,
            last_exit: Instant::now(),
            exitless_warned: false,
            spin_watch: SpinWatch::new(Instant::now()),
            logging_written_pages: false,
            written: preemption::WrittenPages::default(),
            repeats: preemption::Repeats::default(),
            user_mode_stops: Platform::detect() == Platform::Hardware,
            preempted: false,
            chaos_quanta: None,
            computed_ns: 0,
            shadow: None,
            late: None,
            late_searches: LateSearches::default(),
        }
    }
}
