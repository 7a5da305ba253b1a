//! The guest's sense of time. Devices that tell time (PIT, CMOS clock) read it
//! through this trait only, so that time is one of the VMM's inputs: host time
//! when running or recording, logical time in a pinned run, logged values
//! when replaying.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// Nanoseconds since the VM was created; never goes backwards.
    fn monotonic_ns(&self) -> u64;
    /// Wall-clock time in nanoseconds since the Unix epoch.
    fn wall_ns(&self) -> u64;
}

/// Time as the host sees it, counted from the VM's virtual time zero.
pub struct HostClock {
    start: Instant,
    start_ns: u64,
}

impl HostClock {
    /// A clock that reads `start_ns` now: a restored snapshot carries on from
    /// the virtual time it was taken at.
    pub fn starting_at(start_ns: u64) -> Self {
        HostClock {
            start: Instant::now(),
            start_ns,
        }
    }

    /// The host instant at which the clock reads `ns` (now, if it has
    /// passed).
    pub fn instant_at(&self, ns: u64) -> Instant {
        Instant::now() + Duration::from_nanos(ns.saturating_sub(self.monotonic_ns()))
    }

    /// Sleeps until the clock reads `ns`, or until `limit`.
    pub fn sleep_until(&self, ns: u64, limit: Instant) {
        let wait = Duration::from_nanos(ns.saturating_sub(self.monotonic_ns()));
        std::thread::sleep(wait.min(limit.saturating_duration_since(Instant::now())));
    }
}

impl Clock for HostClock {
    fn monotonic_ns(&self) -> u64 {
        self.start_ns + self.start.elapsed().as_nanos() as u64
    }

    fn wall_ns(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// Logical time for a pinned run: it moves only with the guest's progress,
/// never with the host's, so that a run's every clock reading (and with them
/// every tick's place) is a function of what the guest did before it.
///
/// Each VM exit advances it by a fixed step; a guest halted until a timer
/// deadline jumps to it, since nothing else can happen before.
pub struct PinnedClock {
    /// The virtual time the run started at (the snapshot's).
    start_ns: u64,
    now_ns: AtomicU64,
    /// The wall-clock time at `start_ns`, nanoseconds since the Unix epoch.
    epoch_ns: u64,
    /// How far one VM exit advances the clock.
    exit_step_ns: u64,
}

/// One VM exit's worth of guest time: about what an exit costs where guest
/// ring 0 is emulated, so that ticks come at a rate like a plain run's.
pub const PINNED_EXIT_STEP_NS: u64 = 10_000;

impl PinnedClock {
    /// A clock reading `start_ns`, whose wall clock reads `epoch_ns` then.
    pub fn new(start_ns: u64, epoch_ns: u64, exit_step_ns: u64) -> Self {
        PinnedClock {
            start_ns,
            now_ns: AtomicU64::new(start_ns),
            epoch_ns,
            exit_step_ns,
        }
    }

    /// The guest made a VM exit: its progress moves time on one step.
    pub fn exit(&self) {
        self.now_ns.fetch_add(self.exit_step_ns, Ordering::Relaxed);
    }

    /// The guest halted until `ns`: time jumps there (never back).
    pub fn skip_to(&self, ns: u64) {
        self.now_ns.fetch_max(ns, Ordering::Relaxed);
    }
}

impl Clock for PinnedClock {
    fn monotonic_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }

    fn wall_ns(&self) -> u64 {
        self.epoch_ns + (self.monotonic_ns() - self.start_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_time_moves_with_exits_and_halts_only() {
        let clock = PinnedClock::new(5_000, 946_684_800_000_000_000, 10);
        assert_eq!(clock.monotonic_ns(), 5_000);
        clock.exit();
        clock.exit();
        assert_eq!(clock.monotonic_ns(), 5_020);
        clock.skip_to(9_000);
        clock.skip_to(8_000);
        assert_eq!(clock.monotonic_ns(), 9_000);
        assert_eq!(clock.wall_ns(), 946_684_800_000_004_000);
    }
}
