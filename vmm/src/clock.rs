//! The guest's sense of time. Devices that tell time (PIT, CMOS clock) read it
//! through this trait only, so that time is one of the VMM's inputs: host time
//! when running or recording, logged values when replaying.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// Nanoseconds since the VM was created; never goes backwards.
    fn monotonic_ns(&self) -> u64;
    /// Wall-clock time in nanoseconds since the Unix epoch.
    fn wall_ns(&self) -> u64;
}

/// Time as the host sees it.
pub struct HostClock {
    start: Instant,
}

impl HostClock {
    pub fn new() -> Self {
        HostClock {
            start: Instant::now(),
        }
    }
}

impl Default for HostClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for HostClock {
    fn monotonic_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn wall_ns(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}
