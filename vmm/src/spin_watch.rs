//! Tells a guest kernel that works without VM exits from one that spins.
//!
//! Between two exits the run loop sees the guest only at the kick timer's
//! interruptions, and only its registers. A kernel spinning with interrupts
//! on, waiting for a tick that only an exit can bring (a jiffies wait), goes
//! round the same few instructions with the same registers: nothing it reads
//! changes until the tick comes. A kernel that works (unmapping a process's
//! memory, copying, zeroing pages) is somewhere new at each kick: its
//! pointers and counters move on. So every kick's register state is noted,
//! and the guest spins once no kick has found a state not seen before in
//! this stretch for a whole limit.
//!
//! Reading the registers is no input: the guest observes nothing of it, and
//! a recording or its replay goes on the same whether it was watched or not.
//! A spin whose registers never repeat (a loop that counts) is not seen as
//! one; it runs into the run's time limit instead.

use std::collections::HashSet;
use std::time::{Duration, Instant};

/// At most this many states are kept; a stretch with more starts again,
/// so that memory stays bounded and a spin after long work is still seen.
const MAX_STATES: usize = 1 << 16;

/// The register states seen since the last VM exit.
pub struct SpinWatch {
    /// Digests of the states seen at kicks (`vcpu::register_digest`).
    seen: HashSet<u64>,
    /// When a kick last found a state not seen before in this stretch.
    last_new: Instant,
}

impl SpinWatch {
    pub fn new(now: Instant) -> Self {
        SpinWatch {
            seen: HashSet::new(),
            last_new: now,
        }
    }

    /// The guest exited: a new stretch begins. Cheap when no kick came
    /// since the last exit, as is usual.
    pub fn exited(&mut self, now: Instant) {
        if !self.seen.is_empty() {
            self.seen = HashSet::new();
        }
        self.last_new = now;
    }

    /// A kick found the guest in the state `digest`.
    pub fn sampled(&mut self, digest: u64, now: Instant) {
        if self.seen.len() >= MAX_STATES {
            self.seen = HashSet::new();
        }
        if self.seen.insert(digest) {
            self.last_new = now;
        }
    }

    /// How long the guest has only gone round states it was in before.
    pub fn repeating_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_new)
    }

    /// How many different states it went through in this stretch.
    pub fn states(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use kvm_ioctls::Kvm;

    use super::*;
    use crate::probes::code_guest::CodeGuest;
    use crate::vcpu::{register_digest, Kicker};

    const KICK: Duration = Duration::from_millis(10);

    /// Feeds `samples` one kick apart from `start`; returns the time after
    /// the last.
    fn kicks(watch: &mut SpinWatch, start: Instant, samples: impl Iterator<Item = u64>) -> Instant {
        let mut now = start;
        for digest in samples {
            now += KICK;
            watch.sampled(digest, now);
        }
        now
    }

    /// A jiffies wait: three states over and over. It repeats from the
    /// fourth kick on.
    #[test]
    fn a_loop_over_the_same_states_is_repeating() {
        let start = Instant::now();
        let mut watch = SpinWatch::new(start);
        let now = kicks(&mut watch, start, [1, 2, 3].into_iter().cycle().take(1000));
        assert_eq!(watch.states(), 3);
        assert_eq!(watch.repeating_for(now), KICK * 997);
    }

    /// Work: somewhere new at every kick, however long it lasts, past the
    /// bound on remembered states too.
    #[test]
    fn a_kernel_that_moves_on_never_repeats() {
        let start = Instant::now();
        let mut watch = SpinWatch::new(start);
        let now = kicks(&mut watch, start, 0..(MAX_STATES as u64 * 3));
        assert_eq!(watch.repeating_for(now), Duration::ZERO);
        assert!(watch.states() <= MAX_STATES);
    }

    /// Work, then a spin: the spin is seen once its states repeat.
    #[test]
    fn a_spin_after_work_is_seen() {
        let start = Instant::now();
        let mut watch = SpinWatch::new(start);
        let worked = kicks(&mut watch, start, 100..10_000);
        let now = kicks(&mut watch, worked, [7, 8].into_iter().cycle().take(500));
        assert_eq!(watch.repeating_for(now), KICK * 498);
    }

    /// An exit starts a new stretch: what came before it is forgotten.
    #[test]
    fn an_exit_forgets_the_stretch() {
        let start = Instant::now();
        let mut watch = SpinWatch::new(start);
        let now = kicks(&mut watch, start, std::iter::repeat_n(5, 100));
        assert!(watch.repeating_for(now) > Duration::ZERO);
        watch.exited(now);
        assert_eq!(
            (watch.states(), watch.repeating_for(now)),
            (0, Duration::ZERO)
        );
        watch.sampled(5, now + KICK);
        assert_eq!(watch.repeating_for(now + KICK), Duration::ZERO);
    }

    /// Runs `code` (32-bit, ring 0: emulated on PVM) for `time`, kicked out
    /// every 10 ms as a recording's run loop is, and watches it there.
    fn watch_guest(code: &[u8], time: Duration) -> SpinWatch {
        let mut guest = CodeGuest::new(&Kvm::new().unwrap(), code, false).unwrap();
        let mut kicker = Kicker::for_current_thread().unwrap();
        let start = Instant::now();
        let mut watch = SpinWatch::new(start);
        while start.elapsed() < time {
            kicker.arm(KICK).unwrap();
            let ran = guest.vcpu.fd.run().map(drop);
            kicker.disarm().unwrap();
            assert!(
                matches!(&ran, Err(error) if error.errno() == libc::EINTR),
                "{ran:?}"
            );
            let regs = guest.vcpu.fd.get_regs().unwrap();
            watch.sampled(register_digest(&regs), Instant::now());
        }
        watch
    }

    /// On this host's KVM: a kernel looping in place is seen repeating its
    /// one state; one that counts is somewhere new at (nearly) every kick.
    #[test]
    fn a_guest_in_a_loop_repeats_and_a_counting_one_does_not() {
        let time = Duration::from_millis(400);
        let spin = watch_guest(&[0xeb, 0xfe], time); // jmp $
        assert_eq!(spin.states(), 1);
        assert!(spin.repeating_for(Instant::now()) > time / 2);
        let count = watch_guest(&[0x40, 0xeb, 0xfd], time); // 1: inc eax; jmp 1b
        assert!(count.states() > 10, "{}", count.states());
        // A kick that came before the guest ran on a busy host repeats.
        assert!(count.repeating_for(Instant::now()) < time / 4);
    }
}
