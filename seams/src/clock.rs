//! The time a recorder answers the guest with: the host's, or in a pinned
//! run logical time that only the guest's progress moves.

use std::time::Instant;

use provm_vmm::clock::{Clock, HostClock, PinnedClock};

pub enum RecorderClock {
    Host(HostClock),
    Pinned(PinnedClock),
}

impl RecorderClock {
    /// The guest made a VM exit.
    pub fn exit(&self) {
        if let RecorderClock::Pinned(clock) = self {
            clock.exit();
        }
    }

    /// The guest halted until the clock reads `ns`: host time is waited
    /// for (up to `limit`), logical time jumps there.
    pub fn wait_until(&self, ns: u64, limit: Instant) {
        match self {
            RecorderClock::Host(clock) => clock.sleep_until(ns, limit),
            RecorderClock::Pinned(clock) => clock.skip_to(ns),
        }
    }
}

impl Clock for RecorderClock {
    fn monotonic_ns(&self) -> u64 {
        match self {
            RecorderClock::Host(clock) => clock.monotonic_ns(),
            RecorderClock::Pinned(clock) => clock.monotonic_ns(),
        }
    }

    fn wall_ns(&self) -> u64 {
        match self {
            RecorderClock::Host(clock) => clock.wall_ns(),
            RecorderClock::Pinned(clock) => clock.wall_ns(),
        }
    }
}
