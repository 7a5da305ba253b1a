//! The guest's sense of time. Devices that tell time (PIT, CMOS clock) read it
//! through this trait only, so that time is one of the VMM's inputs: host time
//! when running or recording, logged values when replaying.

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
