//! Replaying an exit that KVM does not make again by itself where the
//! recording had it (`LoggedStop`): a preemption, which the recorder made
//! at an instruction of its choosing (`crate::preemption`), and an
//! interrupt-window exit, whatever this host's KVM would do
//! (`Delivery::LoggedWindow`). Both are found the same way: a hardware
//! breakpoint on the logged RIP, and the stop there in the logged state.
//! A preemption's state is more than its registers (a loop whose
//! registers repeat at every pass changes memory): the run loop checks
//! the rest (`Vm::preemption_stop`) where the registers match.
//!
//! A recording that waited at KVM's interrupt-window exits logged where
//! each came: RIP and a digest of the registers. Where KVM places that exit
//! differs between kernels: a trace recorded on SVM with Linux 6.12
//! diverged on 6.1 at its first window, 6.1's exit coming six bytes
//! earlier, on the instruction in STI's shadow. So the replay puts a
//! hardware breakpoint on the logged RIP, and the stop there with the
//! logged registers stands for the exit; a stop at that RIP in another
//! state (an earlier pass through a loop) is stepped over and the guest
//! goes on. It asks KVM for the window as well: an exit that lands on the
//! logged place is taken as it is, and one that comes early is passed
//! over for the breakpoint. A breakpoint alone missed a window on the SVM
//! test bed: where an interrupt was injected at the breakpoint's stop, the
//! next window came at the same RIP after the handler's IRET, and no
//! breakpoint stopped the guest there (QEMU's TCG under the L1 KVM), while
//! KVM's window did.
//!
//! A window logged earlier than this host's KVM places it, in STI's
//! shadow, is found by the breakpoint; VMX cannot inject an interrupt in
//! that shadow, so such a replay diverges there, saying so.
//!
//! Hardware breakpoints stop the guest in every mode on VMX and SVM hosts;
//! PVM stops only its emulated ring 0 (`guest_debug`), so a replay there
//! is refused before it starts.

use std::cell::Cell;

use crate::guest_debug::{GuestDebug, GuestDebugError, HW_BREAKPOINTS};
use crate::seam::{Instance, LoggedStop, Place};

/// DR6's bits for DR0-DR3 and for a single step (BS).
const DR6_HITS: u64 = 0xf;
const DR6_SINGLE_STEP: u64 = 1 << 14;

/// The logged stop the guest runs to, if any, and which debug register
/// its breakpoint took at the last KVM_SET_GUEST_DEBUG.
#[derive(Default)]
pub struct StopBreakpoint {
    target: Option<LoggedStop>,
    /// The breakpoint waits: the guest runs freely first
    /// (`preemption::late_arming`).
    held: bool,
    /// Where the breakpoint goes instead of the logged place: the guest
    /// kernel's `#BP` handler, while the place is found with `int3`s
    /// (`user_trap`).
    trap_handler: Option<u64>,
    slot: Cell<Option<usize>>,
}

/// What a debug stop was, for the logged stop.
#[derive(Debug, PartialEq, Eq)]
pub enum StopKind {
    /// The guest stands at the logged place: that is the exit (for a
    /// preemption, once its instance is checked too).
    Reached,
    /// Only the stop's breakpoint stopped it, in another state: step over
    /// it and go on, unseen.
    Passing,
    /// Not the logged stop's business (the debugger's stop).
    Other,
    /// A stop of the search for a place in user code (`user_trap`): the
    /// guest goes on, unseen.
    Searching,
}

impl StopBreakpoint {
    /// Runs the guest to `target` from now on (`None`: to no stop).
    /// Returns whether that changed, so the breakpoints must be applied
    /// again.
    pub fn aim(&mut self, target: Option<LoggedStop>) -> bool {
        let changed = self.target != target;
        self.target = target;
        changed
    }

    /// Holds the breakpoint back (`held`) or arms it. Returns whether
    /// that changed, so the breakpoints must be applied again.
    pub fn hold(&mut self, held: bool) -> bool {
        std::mem::replace(&mut self.held, held) != held
    }

    /// Puts the breakpoint on `handler` instead of the logged place
    /// (`None`: back on the place). Returns whether that changed, so the
    /// breakpoints must be applied again.
    pub fn trap_at(&mut self, handler: Option<u64>) -> bool {
        std::mem::replace(&mut self.trap_handler, handler) != handler
    }

    /// The logged stop the guest ran to, now reached: it runs to none.
    pub fn take(&mut self) -> Option<LoggedStop> {
        self.held = false;
        self.trap_handler = None;
        self.target.take()
    }

    /// Whether the guest runs to a logged stop.
    pub fn aimed(&self) -> bool {
        self.target.is_some()
    }

    /// The instance of a preemption the guest runs to.
    pub fn preemption(&self) -> Option<&Instance> {
        match &self.target {
            Some(LoggedStop::Preemption(_, instance)) => Some(instance),
            _ => None,
        }
    }

    /// The logged place the guest runs to.
    pub fn place(&self) -> Option<Place> {
        self.target.as_ref().map(LoggedStop::place)
    }

    /// `debug` with the logged stop's breakpoint after its own, if the
    /// guest runs to one and it is not held back.
    pub fn added_to(&self, debug: &GuestDebug) -> Result<GuestDebug, GuestDebugError> {
        self.slot.set(None);
        let Some(place) = self.place().filter(|_| !self.held) else {
            return Ok(debug.clone());
        };
        if debug.breakpoints.len() >= HW_BREAKPOINTS {
            return Err(GuestDebugError::WindowBreakpoint);
        }
        let mut debug = debug.clone();
        self.slot.set(Some(debug.breakpoints.len()));
        debug
            .breakpoints
            .push(self.trap_handler.unwrap_or(place.rip));
        Ok(debug)
    }

    /// Whether KVM's window exit at `now` came before the logged place
    /// (this host's KVM opens it earlier than the recording's did).
    pub fn opens_early(&self, now: Place) -> bool {
        self.place().is_some_and(|place| place != now)
    }

    /// The breakpoints applied last were without the logged stop's.
    pub fn left_out(&self) {
        self.slot.set(None);
    }

    /// What the debug stop with `dr6` at `now` (the guest's place there)
    /// was.
    pub fn stop(&self, dr6: u64, now: Place) -> StopKind {
        let Some(place) = self.place() else {
            return StopKind::Other;
        };
        if now == place {
            return StopKind::Reached;
        }
        let ours_alone = self
            .slot
            .get()
            .is_some_and(|slot| dr6 & (DR6_HITS | DR6_SINGLE_STEP) == 1 << slot);
        if ours_alone && now.rip == place.rip {
            StopKind::Passing
        } else {
            StopKind::Other
        }
    }
}

/// The bits of DR6 that a breakpoint or single-step stop set in `after`
/// which the guest's `before` lacked: the hit bits (B0-B3) and BS. What
/// the guest set itself, or any other bit, is not the stop's.
pub fn dr6_marks(before: u64, after: u64) -> u64 {
    after & !before & (DR6_HITS | DR6_SINGLE_STEP)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Place = Place {
        rip: 0xffff_ffff_8117_1e57,
        registers: 0x1234,
    };

    fn debugger(breakpoints: usize) -> GuestDebug {
        GuestDebug {
            breakpoints: (0..breakpoints as u64).map(|i| 0x1000 + i).collect(),
            single_step: false,
        }
    }

    #[test]
    fn the_windows_breakpoint_follows_the_debuggers() {
        let mut window = StopBreakpoint::default();
        assert_eq!(window.added_to(&debugger(2)).unwrap(), debugger(2));
        assert!(window.aim(Some(LoggedStop::Window(WINDOW))));
        assert!(!window.aim(Some(LoggedStop::Window(WINDOW))));
        let applied = window.added_to(&debugger(2)).unwrap();
        assert_eq!(applied.breakpoints, [0x1000, 0x1001, WINDOW.rip]);
        assert!(matches!(
            window.added_to(&debugger(HW_BREAKPOINTS)),
            Err(GuestDebugError::WindowBreakpoint)
        ));
    }

    #[test]
    fn a_held_breakpoint_is_left_out_until_armed_or_reached() {
        let mut stop = StopBreakpoint::default();
        stop.aim(Some(LoggedStop::Window(WINDOW)));
        assert!(stop.hold(true));
        assert!(!stop.hold(true));
        assert_eq!(stop.added_to(&debugger(1)).unwrap(), debugger(1));
        assert!(stop.hold(false));
        assert_eq!(
            stop.added_to(&debugger(0)).unwrap().breakpoints,
            [WINDOW.rip]
        );
        stop.hold(true);
        stop.take();
        // The next stop is armed unless held anew.
        stop.aim(Some(LoggedStop::Window(WINDOW)));
        assert_eq!(
            stop.added_to(&debugger(0)).unwrap().breakpoints,
            [WINDOW.rip]
        );
    }

    #[test]
    fn a_stop_is_the_window_only_where_the_registers_match() {
        let mut window = StopBreakpoint::default();
        window.aim(Some(LoggedStop::Window(WINDOW)));
        window.added_to(&debugger(1)).unwrap();
        let elsewhere = Place {
            registers: 0x5678,
            ..WINDOW
        };
        // Its breakpoint is DR1, after the debugger's DR0.
        assert_eq!(window.stop(0b10, WINDOW), StopKind::Reached);
        assert_eq!(window.stop(0b10, elsewhere), StopKind::Passing);
        // The debugger's own stop at that RIP, or a step onto it, is the
        // debugger's.
        assert_eq!(window.stop(0b11, elsewhere), StopKind::Other);
        assert_eq!(window.stop(DR6_SINGLE_STEP, elsewhere), StopKind::Other);
        // A step that lands on the window with its registers is the window.
        assert_eq!(window.stop(DR6_SINGLE_STEP, WINDOW), StopKind::Reached);
        window.aim(None);
        assert_eq!(window.stop(0b10, WINDOW), StopKind::Other);
    }

    #[test]
    fn a_stops_marks_are_the_hit_and_step_bits_the_guest_lacked() {
        // DR6's reset value, then a hit on DR1 and a step.
        assert_eq!(dr6_marks(0xffff_0ff0, 0xffff_0ff0), 0);
        assert_eq!(dr6_marks(0xffff_0ff0, 0xffff_0ff2), 0b10);
        assert_eq!(dr6_marks(0xffff_0ff0, 0xffff_4ff1), 0x4001);
        // A hit bit the guest had already is its own.
        assert_eq!(dr6_marks(0xffff_0ff1, 0xffff_0ff3), 0b10);
        // BD, BT and the reserved bits are never the stop's.
        assert_eq!(dr6_marks(0xffff_0ff0, 0xffff_aff0), 0);
    }

    #[test]
    fn kvms_window_counts_only_on_the_logged_place() {
        let mut window = StopBreakpoint::default();
        let early = Place {
            rip: WINDOW.rip - 6,
            ..WINDOW
        };
        assert!(!window.opens_early(early));
        window.aim(Some(LoggedStop::Window(WINDOW)));
        assert!(window.opens_early(early));
        assert!(!window.opens_early(WINDOW));
    }
}
