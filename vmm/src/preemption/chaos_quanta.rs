//! `record --chaos SEED` with `--preempt MS`: every stretch without exits
//! gets a quantum of its own, drawn from the seed, so that different seeds
//! preempt computing guest code after different times, and so interleave
//! its processes and vCPUs differently (rr's chaos mode draws its
//! timeslices likewise). A replay follows the trace's preemptions and needs
//! neither the seed nor the quanta.

use std::time::Duration;

use rand_core::{Rng, SeedableRng};
use rand_xorshift::XorShiftRng;

/// A drawn quantum is this many eighths of `--preempt`'s, at least one:
/// from an eighth of it to twice it.
const MAX_EIGHTHS: u32 = 16;

/// Mixed into the seed, so that the quanta are not the vCPU schedule's
/// draws (`scheduler`), which the same seed gives.
const STREAM: u64 = 0x6b69_636b_7175_616e;

pub struct ChaosQuanta {
    rng: XorShiftRng,
    /// The current stretch's quantum, in eighths of the seam's.
    eighths: u32,
}

impl ChaosQuanta {
    /// The quanta of `seed`, the first stretch's drawn.
    pub fn new(seed: u64) -> Self {
        let mut quanta = ChaosQuanta {
            rng: XorShiftRng::seed_from_u64(seed ^ STREAM),
            eighths: 0,
        };
        quanta.next_stretch();
        quanta
    }

    /// The guest exited: the next stretch's quantum is drawn.
    pub fn next_stretch(&mut self) {
        self.eighths = 1 + self.rng.next_u32() % MAX_EIGHTHS;
    }

    /// This stretch's quantum, for `base` (`--preempt`'s).
    pub fn of(&self, base: Duration) -> Duration {
        base * self.eighths / 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drawn(seed: u64, stretches: usize) -> Vec<Duration> {
        let mut quanta = ChaosQuanta::new(seed);
        (0..stretches)
            .map(|_| {
                let quantum = quanta.of(Duration::from_millis(8));
                quanta.next_stretch();
                quantum
            })
            .collect()
    }

    #[test]
    fn a_seed_fixes_the_quanta_and_another_draws_others() {
        assert_eq!(drawn(3, 50), drawn(3, 50));
        assert_ne!(drawn(3, 50), drawn(4, 50));
    }

    #[test]
    fn quanta_range_from_an_eighth_to_twice_the_base() {
        let quanta = drawn(11, 2000);
        assert_eq!(quanta.iter().min(), Some(&Duration::from_millis(1)));
        assert_eq!(quanta.iter().max(), Some(&Duration::from_millis(16)));
    }
}
