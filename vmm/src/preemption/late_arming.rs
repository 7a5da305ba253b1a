//! Finding a preemption of a computation that ends by itself without a
//! breakpoint stop at every pass. The recorder logged how long the guest
//! computed before it (`Instance::ran_ns`, its thread's CPU time in the
//! guest since the last exit), so the replay looks at the first few
//! passes through the place, then runs the guest freely for a share of
//! that, arms the breakpoint again only then, and searches as for any
//! preemption. A guest that ran past the logged instance on the way (it
//! computed faster than when it was recorded) shows it by an exit the
//! recording did not have in that stretch, or by computing far longer than
//! the recording did without finding it: the replay rolls back to the
//! stretch's start (`rollback`, and the vCPU's saved state) and tries
//! again with a smaller share, the last time none: the search from the
//! stretch's start, which always finds it. Its stops at the place tell the
//! replay that the guest is searched, not spinning without exits
//! (`Seam::passed_logged_stop`), however slow they are.
//!
//! What this keeps is one search's schedule and the guest's computing
//! time in the current attempt; the run loop does the rest
//! (`vm/late_arming.rs`).

/// The first attempt first searches from the stretch's start for this
/// many stops before it runs freely: a recorder's kick often lands where
/// the guest stood for most of the stretch, at its first pass through the
/// place (an instruction whose page faults KVM handled while the kick
/// came: on the SVM test bed 178 of 1,113 preemptions of a busybox sh
/// loop were found at the first stop from the start, after a median 35%
/// of the recorded time, where the free runs had gone past them). Nothing
/// is missed on the way to the free run: every pass so far was looked at.
const FIRST_PASSES: u64 = 4;

/// The share of the recording's computing time, in per cent, that each
/// attempt runs the guest without the breakpoint: most of it first (a tight
/// loop pays a breakpoint stop per pass only for the last tenth), then half
/// (a guest that ran a quarter faster than recorded), then none.
const FREE_RUN_PERCENT: [u64; 3] = [90, 50, 0];

/// An attempt after a free run that has computed this many times the
/// recording's stretch without reaching the instance ran past it: the
/// replayed guest computes at the recorded guest's speed give or take
/// what the host's load does, and a factor of two is far outside that
/// while costing at most one more stretch's time. The breakpoint stops'
/// own cost is not counted (`entered`).
const OVERRUN_FACTOR: u64 = 2;
/// But where the stops cost about what a step over the breakpoint costs
/// (a loop of a few instructions, or a host that emulates the CPU, as
/// QEMU's TCG under the SVM test bed), what is left of the guest's time
/// after taking theirs off says nothing, and a guest that ran past the
/// instance in such a loop would be searched for ever. So an attempt is
/// also cut after this many times the recording's stretch in all: the
/// late search of a loop whose stops cost more gives way to the next
/// attempt, the last being the search from the stretch's start. Not
/// much less: where a loop's place is passed very often, cutting early
/// sends the search back to the stretch's start, whose stops are ten
/// times as many. One trace of a busybox sh loop on the SVM test bed
/// (about 150 preemptions), each replayed twice: at 20, 37 and 39 of them
/// were searched from the start (11,000 to 34,000 stops each), after 78
/// and 81 rollbacks, in 104 s; at 200, 13 and 21, after 32 and 47, in 82
/// and 70 s. A guest that did run past the instance in such a loop is
/// found out as much later.
const SEARCH_FACTOR: u64 = 200;
/// Nor longer than this in all, whatever the recording's stretch: a
/// bounded attempt must end well within the replay's limit on a guest
/// running without an exit (at least 60 s: the seams'
/// `RecordedEnd::exitless_limit`, timed afresh at each rollback,
/// `Seam::rolled_back`), or the replay stops there as a divergence
/// before the search from the start, the one that always finds the
/// instance, has begun. 200 times a long stretch (a host busy while it
/// recorded) can pass that limit: in a bench run at 200 without this cap
/// one two_counters replay of five failed, presumably so (no log kept).
const SEARCH_CAP_NS: u64 = 10_000_000_000;
/// And this much more, so that a short stretch is not cut by the kick
/// timer's granularity and the host's scheduling noise.
const OVERRUN_SLACK_NS: u64 = 20_000_000;

/// Where an attempt stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Phase {
    /// With the breakpoint, at the first passes from the stretch's start
    /// (`FIRST_PASSES`).
    FirstPasses,
    /// Running without the breakpoint for `left_ns` more of guest time.
    FreeRun { left_ns: u64 },
    /// With the breakpoint, looking at each stop at the place.
    Search,
    /// Past the bound without finding the instance: roll back.
    Overran,
}

/// One logged preemption's search.
#[derive(Debug)]
pub struct LateArming {
    /// The recording's stretch: its guest's computing time.
    ran_ns: u64,
    /// Which of `FREE_RUN_PERCENT` this attempt runs freely for.
    attempt: usize,
    /// The vCPU thread's time in the guest in this attempt...
    entered_ns: u64,
    /// ...of which this was spent stepping over the breakpoint...
    stepping_ns: u64,
    /// ...in this many steps, one per stop at the place in another state.
    stops: u64,
}

impl LateArming {
    pub fn new(ran_ns: u64) -> Self {
        LateArming {
            ran_ns,
            attempt: 0,
            entered_ns: 0,
            stepping_ns: 0,
            stops: 0,
        }
    }

    /// The guest ran for `cpu_ns` of its thread's time in one entry;
    /// `stepping_over`: a step over the breakpoint. A step costs what
    /// each stop costs (an exit and an entry) and almost no guest work,
    /// so the steps' time stands in for the stops': what the guest itself
    /// computed is the rest, comparable with the recording's.
    pub fn entered(&mut self, cpu_ns: u64, stepping_over: bool) {
        self.entered_ns += cpu_ns;
        if stepping_over {
            self.stepping_ns += cpu_ns;
            self.stops += 1;
        }
    }

    fn computed_ns(&self) -> u64 {
        // Each stop is a step's cost twice: its own exit, and the step.
        self.entered_ns.saturating_sub(2 * self.stepping_ns)
    }

    fn free_run_ns(&self) -> u64 {
        self.ran_ns / 100 * FREE_RUN_PERCENT[self.attempt]
            + self.ran_ns % 100 * FREE_RUN_PERCENT[self.attempt] / 100
    }

    /// Whether this attempt began with a free run, so that it can run
    /// past the instance and is bounded; the last one is not.
    pub fn ran_freely(&self) -> bool {
        FREE_RUN_PERCENT[self.attempt] > 0
    }

    pub fn phase(&self) -> Phase {
        let free_run = self.free_run_ns();
        if self.entered_ns < free_run {
            // The first attempt looks at the first passes before it runs
            // freely.
            if self.attempt == 0 && self.stops < FIRST_PASSES {
                return Phase::FirstPasses;
            }
            // No stop in a free run: all its time is the guest's, and once
            // over it stays over.
            return Phase::FreeRun {
                left_ns: free_run - self.entered_ns,
            };
        }
        let computed = self.computed_ns();
        let bound = |factor: u64| {
            self.ran_ns
                .saturating_mul(factor)
                .saturating_add(OVERRUN_SLACK_NS)
        };
        let overran = computed > bound(OVERRUN_FACTOR)
            || self.entered_ns > bound(SEARCH_FACTOR).min(SEARCH_CAP_NS);
        if self.ran_freely() && overran {
            return Phase::Overran;
        }
        Phase::Search
    }

    /// The guest was put back at the stretch's start: the next attempt
    /// runs freely for a smaller share.
    pub fn rolled_back(&mut self) {
        assert!(
            self.ran_freely(),
            "only an attempt that ran freely rolls back"
        );
        self.attempt += 1;
        self.entered_ns = 0;
        self.stepping_ns = 0;
        self.stops = 0;
    }

    /// How far this attempt has come, in per cent of the recording's
    /// stretch: the guest's own computing time, as `phase` counts it.
    pub fn computed_percent(&self) -> u64 {
        (self.computed_ns() as u128 * 100 / self.ran_ns.max(1) as u128) as u64
    }

    /// The breakpoint stops this attempt passed over.
    pub fn stops(&self) -> u64 {
        self.stops
    }

    /// The share of the recording's stretch this attempt ran freely for,
    /// in per cent.
    pub fn free_run_percent(&self) -> u64 {
        FREE_RUN_PERCENT[self.attempt]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn an_attempt_runs_freely_for_its_share_then_searches_then_overruns() {
        let mut search = LateArming::new(100 * MS);
        // The first passes, at no cost here: stepped over.
        for _ in 0..FIRST_PASSES {
            assert_eq!(search.phase(), Phase::FirstPasses);
            search.entered(0, false);
            search.entered(0, true);
        }
        assert_eq!(search.phase(), Phase::FreeRun { left_ns: 90 * MS });
        search.entered(60 * MS, false);
        assert_eq!(search.phase(), Phase::FreeRun { left_ns: 30 * MS });
        search.entered(30 * MS, false);
        assert_eq!(search.phase(), Phase::Search);
        // Breakpoint stops: their steps' cost (twice) is not the guest's.
        for _ in 0..1000 {
            search.entered(MS / 10 + 20_000, false);
            search.entered(MS / 10, true);
        }
        assert_eq!(search.computed_ns(), 90 * MS + 20 * MS);
        assert_eq!(search.phase(), Phase::Search);
        // Twice the recording's stretch, and the slack.
        search.entered(110 * MS, false);
        assert_eq!(search.phase(), Phase::Search);
        search.entered(1, false);
        assert_eq!(search.phase(), Phase::Overran);
    }

    #[test]
    fn the_first_passes_are_searched_until_the_free_run_would_be_over() {
        let mut search = LateArming::new(100 * MS);
        search.entered(50 * MS, false);
        search.entered(MS, true);
        assert_eq!(search.phase(), Phase::FirstPasses);
        // A long way to the first passes: the free run is over by then.
        search.entered(40 * MS, false);
        assert_eq!(search.phase(), Phase::Search);
        // Only the first attempt begins so.
        search.rolled_back();
        assert_eq!(search.phase(), Phase::FreeRun { left_ns: 50 * MS });
    }

    #[test]
    fn a_search_whose_stops_cost_what_steps_cost_is_cut_in_all() {
        let mut search = LateArming::new(10 * MS);
        search.entered(9 * MS, false);
        assert_eq!(search.phase(), Phase::Search);
        // Stops as dear as steps: the guest's own time stays at 9 ms.
        for _ in 0..1000 {
            search.entered(MS, false);
            search.entered(MS, true);
        }
        assert_eq!(search.computed_ns(), 9 * MS);
        assert_eq!(search.phase(), Phase::Search);
        search.entered(20 * MS, true);
        assert_eq!(search.phase(), Phase::Overran);
    }

    #[test]
    fn a_long_stretchs_search_is_cut_within_the_replays_limit() {
        let mut search = LateArming::new(1000 * MS);
        search.entered(900 * MS, false);
        // Stops as dear as steps, for 10 s in all: not yet 200 stretches.
        for _ in 0..4550 {
            search.entered(MS, false);
            search.entered(MS, true);
        }
        assert_eq!(search.phase(), Phase::Search);
        search.entered(MS, true);
        assert_eq!(search.phase(), Phase::Overran);
    }

    #[test]
    fn each_rollback_runs_freely_for_less_until_the_unbounded_search() {
        let mut search = LateArming::new(10 * MS + 1);
        assert_eq!(search.free_run_ns(), 9 * MS);
        search.entered(500 * MS, false);
        assert_eq!(search.phase(), Phase::Overran);
        search.rolled_back();
        assert_eq!(search.phase(), Phase::FreeRun { left_ns: 5 * MS });
        search.rolled_back();
        assert!(!search.ran_freely());
        assert_eq!(search.phase(), Phase::Search);
        // The search from the stretch's start is never cut.
        search.entered(u64::MAX / 2, false);
        assert_eq!(search.phase(), Phase::Search);
    }

    #[test]
    #[should_panic(expected = "only an attempt that ran freely rolls back")]
    fn the_last_attempt_never_rolls_back() {
        let mut search = LateArming::new(MS);
        search.rolled_back();
        search.rolled_back();
        search.rolled_back();
    }
}
