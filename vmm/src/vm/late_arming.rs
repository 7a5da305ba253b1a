//! A replay's late search for a preemption the recorder timed
//! (`preemption::late_arming`), in the run loop: the stretch's start saved
//! (RAM's shadow synced, the vCPU's state), the breakpoint held back for
//! the free run and armed after it, and the rollback to that start when
//! the guest ran past the logged instance.

use std::time::Instant;

use crate::preemption::late_arming::{LateArming, Phase};
use crate::preemption::{self, rollback::Shadow};
use crate::seam::{Instance, LoggedStop};
use crate::vcpu::VcpuState;

use super::{Vm, VmError};

/// One logged preemption's search, under way.
pub(super) struct LateSearch {
    arming: LateArming,
    /// The vCPU at the stretch's start, saved at its first entry.
    start: Option<VcpuState>,
}

impl LateSearch {
    /// Whether its breakpoint waits for the free run's end.
    fn holds_breakpoint(&self) -> bool {
        matches!(self.arming.phase(), Phase::FreeRun { .. })
    }

    /// How much longer the guest runs freely, if it does.
    pub(super) fn free_run_left_ns(&self) -> Option<u64> {
        match self.arming.phase() {
            Phase::FreeRun { left_ns } => Some(left_ns),
            _ => None,
        }
    }

    /// Whether this attempt can run past the instance, so that an exit
    /// before it says so (the last attempt cannot).
    pub(super) fn bounded(&self) -> bool {
        self.arming.ran_freely()
    }

    /// The guest ran for `cpu_ns` in one entry (`LateArming::entered`).
    pub(super) fn entered(&mut self, cpu_ns: u64, stepping_over: bool) {
        self.arming.entered(cpu_ns, stepping_over);
    }
}

/// What the late searches of a run did, for the user.
#[derive(Default)]
pub(super) struct LateSearches {
    /// Preemptions found with the breakpoint armed after a free run.
    found_after_free_run: u64,
    /// Attempts that ran past the instance and were rolled back.
    rollbacks: u64,
}

impl Vm {
    /// At an exit whose logged next exit is `logged`: begins a late search
    /// if that is a preemption the recorder timed. Returns whether the
    /// breakpoint waits.
    pub(super) fn begin_late_search(
        &mut self,
        logged: &Option<LoggedStop>,
    ) -> Result<bool, VmError> {
        if let Some(late) = &self.run_loop.late {
            return Ok(late.holds_breakpoint());
        }
        let Some(LoggedStop::Preemption(
            _,
            Instance {
                ran_ns: Some(ran_ns),
                ..
            },
        )) = logged
        else {
            return Ok(false);
        };
        if self.run_loop.shadow.is_none() {
            preemption::log_written_pages(&self.vm_fd, &self.memory).map_err(VmError::Kvm)?;
            self.run_loop.shadow = Some(Shadow::default());
        }
        let late = LateSearch {
            arming: LateArming::new(*ran_ns),
            start: None,
        };
        let held = late.holds_breakpoint();
        self.run_loop.late = Some(late);
        Ok(held)
    }

    /// Before the first entry of a late search: saves the stretch's start,
    /// RAM in the shadow and the vCPU's state.
    pub(super) fn save_late_search_start(&mut self) -> Result<(), VmError> {
        let Some(late) = &mut self.run_loop.late else {
            return Ok(());
        };
        if late.start.is_some() {
            return Ok(());
        }
        // The last exit's access completes inside KVM at the next entry,
        // where no saved state would see it: completed now, it is part of
        // the start.
        self.vcpu.finish_pending_exit();
        let shadow = self.run_loop.shadow.as_mut().expect("a late search syncs");
        let copied = shadow
            .sync(&self.vm_fd, &self.memory)
            .map_err(VmError::Kvm)?;
        late.start = Some(self.vcpu.save(&self.kvm)?);
        tracing::debug!(
            "late arming: the stretch's start saved ({copied} pages copied); running freely for {}% of the recorded time",
            late.arming.free_run_percent()
        );
        Ok(())
    }

    /// After an entry of a late search that ended without an exit: arms
    /// the breakpoint where the free run is over, rolls back where the
    /// attempt computed past its bound.
    pub(super) fn advance_late_search(&mut self) -> Result<(), VmError> {
        let Some(late) = &self.run_loop.late else {
            return Ok(());
        };
        match late.arming.phase() {
            Phase::FirstPasses => Ok(()),
            Phase::FreeRun { .. } => {
                if self.debug.logged_stop.hold(true) && !self.debug.stepping_over {
                    tracing::debug!("late arming: not among the first passes; running freely");
                    self.apply_guest_debug(&self.debug.guest_debug)?;
                }
                Ok(())
            }
            Phase::Search => {
                if self.debug.logged_stop.hold(false) && !self.debug.stepping_over {
                    tracing::debug!("late arming: the free run is over, the breakpoint armed");
                    self.keep_guest_debugregs(true)?;
                    self.apply_guest_debug(&self.debug.guest_debug)?;
                }
                Ok(())
            }
            Phase::Overran => self.roll_back_late_search("it computed twice the recorded time"),
        }
    }

    /// The guest ran past the logged instance (`why`): puts it back at the
    /// stretch's start, RAM and vCPU, for the next attempt. Nothing of
    /// the way there was seen: no exit was handled, and the kicks only
    /// looked.
    pub(super) fn roll_back_late_search(&mut self, why: &str) -> Result<(), VmError> {
        let late = self
            .run_loop
            .late
            .as_mut()
            .expect("a late search rolls back");
        // An exit's access (an IN's register, a string input's memory)
        // lands at the next entry: completed now, then undone.
        self.vcpu.finish_pending_exit();
        let shadow = self.run_loop.shadow.as_ref().expect("a late search syncs");
        let pages = shadow
            .roll_back(&self.vm_fd, &self.memory)
            .map_err(VmError::Kvm)?;
        self.vcpu.restore(
            &self.kvm,
            late.start.as_ref().expect("saved at its first entry"),
        )?;
        let (percent, stops, reached) = (
            late.arming.free_run_percent(),
            late.arming.stops(),
            late.arming.computed_percent(),
        );
        late.arming.rolled_back();
        self.seam.rolled_back();
        let held = late.holds_breakpoint();
        self.run_loop.late_searches.rollbacks += 1;
        tracing::debug!(
            "late arming: rolled back ({} so far): after a free run of {percent}% and {stops} breakpoint stops, at {reached}%, {why}; {pages} pages put back; next, {}%",
            self.run_loop.late_searches.rollbacks,
            late.arming.free_run_percent()
        );
        // No step or kick of the undone run goes on.
        self.debug.stepping_over = false;
        self.debug.step_over_due = false;
        self.debug.step_kicked = false;
        self.debug.logged_stop.hold(held);
        self.apply_guest_debug(&self.debug.guest_debug)?;
        // The states the spin watch saw were undone with the run.
        self.run_loop.spin_watch.exited(Instant::now());
        self.run_loop.at_exit = false;
        Ok(())
    }

    /// The logged stop was reached: the late search under way, if any,
    /// ends.
    pub(super) fn end_late_search(&mut self) {
        let Some(late) = self.run_loop.late.take() else {
            return;
        };
        let searches = &mut self.run_loop.late_searches;
        if late.arming.phase() == Phase::FirstPasses {
            tracing::debug!(
                "late arming: preemption found among the first passes from the stretch's start, after {} breakpoint stops, at {}%",
                late.arming.stops(),
                late.arming.computed_percent()
            );
        } else if late.arming.ran_freely() {
            searches.found_after_free_run += 1;
            tracing::debug!(
                "late arming: preemption found after a free run of {}% and {} breakpoint stops, at {}% ({} so far, {} rollbacks)",
                late.arming.free_run_percent(),
                late.arming.stops(),
                late.arming.computed_percent(),
                searches.found_after_free_run,
                searches.rollbacks
            );
        } else {
            tracing::debug!(
                "late arming: preemption found by the search from the stretch's start after {} breakpoint stops, at {}% ({} rollbacks so far)",
                late.arming.stops(),
                late.arming.computed_percent(),
                searches.rollbacks
            );
        }
    }
}
