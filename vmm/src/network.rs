//! The host's end of the guest's network card, as a live run's or a
//! recording's seam holds it: something that takes the guest's Ethernet
//! frames and has frames for it. A replay has none: its frames come from
//! the log.

use std::sync::Mutex;
use std::time::Instant;

use crate::clock::HostClock;

/// A network the guest's frames go to and come from (provm's NAT).
pub trait Network: Send {
    /// A frame the guest sent.
    fn send(&mut self, frame: &[u8]);

    /// The next frame for the guest, if one is ready now.
    fn receive(&mut self) -> Option<Vec<u8>>;

    /// Waits until a frame for the guest is ready (true) or `until` passes
    /// (false), doing the network's host-side work meanwhile.
    fn wait_for_frame(&mut self, until: Instant) -> bool;
}

/// A seam's network, shared by the vCPU thread's calls.
pub struct HostNetwork(Mutex<Box<dyn Network>>);

impl HostNetwork {
    pub fn new(network: Box<dyn Network>) -> Self {
        HostNetwork(Mutex::new(network))
    }

    pub fn send(&self, frame: &[u8]) {
        self.0.lock().unwrap().send(frame);
    }

    pub fn receive(&self) -> Option<Vec<u8>> {
        self.0.lock().unwrap().receive()
    }

    /// Waits as `HostClock::sleep_until` does, ending early when a frame
    /// for the guest is ready: a halted guest wakes for it at once rather
    /// than at its next timer tick.
    pub fn wait(&self, clock: &HostClock, ns: u64, limit: Instant) {
        self.0
            .lock()
            .unwrap()
            .wait_for_frame(clock.instant_at(ns).min(limit));
    }
}
