//! Where the host's time goes, exit by exit: in the guest before each VM
//! exit, in the VMM handling it, halted waiting for a tick, logging it (the
//! seam's own cost) and waiting for a host CPU. The VMM measures; an
//! [`ExitObserver`] above it attributes and aggregates (the VMM knows
//! nothing of guest processes).
//!
//! An [`ExitDelay`] makes the VMM wait longer after each exit of one device
//! before it re-enters the guest: a known cost to validate the measurement
//! against, and the changed cost of a what-if replay.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::memory::GuestMemory;

/// How often the vCPU thread's run delay is sampled: reading it is a
/// system call, too dear for every exit.
const RUN_DELAY_PERIOD: Duration = Duration::from_millis(10);

/// One VM exit's share of the host's time, from the guest entry before it
/// to the guest entry after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitTiming {
    /// The device the exit went to (`vm::port_device`, `vm::mmio_device`),
    /// or the exit reason where no device is involved (`halt`, `msr`,
    /// `interrupt-window`).
    pub device: &'static str,
    /// The vCPU that exited, from 0.
    pub vcpu: usize,
    /// In KVM_RUN before the exit (guest time, with its in-kernel exits).
    pub in_guest: Duration,
    /// In the VMM from the exit to the next entry, less the halt and the
    /// logging (an injected delay included: it is measured as part of it).
    pub handling: Duration,
    /// Halted, waiting for the next timer tick.
    pub halted: Duration,
    /// In the seam's logging (a recorder's cost; 0 for a plain run).
    pub logging: Duration,
    /// Of `handling`, the time spent waiting on purpose (`ExitDelay`).
    pub injected: Duration,
    /// Host preemption: the vCPU thread's run delay (runnable, not running)
    /// since the last sample; sampled every `RUN_DELAY_PERIOD`, so 0 at most
    /// exits. Part of the times above, not in addition to them.
    pub run_delay: Duration,
    /// The observer's own time at the previous exit: the cost of capture.
    pub observing: Duration,
}

/// Told of every exit once its handling is done, just before the guest
/// is entered again; it may read guest memory (nothing it does is an input).
pub trait ExitObserver {
    fn exit(&mut self, timing: &ExitTiming, memory: &GuestMemory);
}

/// What an `ExitDelay` adds after each exit of its device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExtraCost {
    /// This much more.
    Fixed(Duration),
    /// The exit's handling time times this factor, in all (2.0 doubles it).
    Scaled(f64),
}

/// Wait longer after each exit of `device` before re-entering the guest.
#[derive(Clone, Debug, PartialEq)]
pub struct ExitDelay {
    pub device: String,
    pub cost: ExtraCost,
}

/// As `--what-if` writes it: `virtio-blk=+1ms`, `virtio-blk=x2`.
impl std::fmt::Display for ExitDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cost {
            ExtraCost::Fixed(extra) => write!(f, "{}=+{}", self.device, whole_unit(extra)),
            ExtraCost::Scaled(factor) => write!(f, "{}=x{factor}", self.device),
        }
    }
}

/// A duration in the largest unit that keeps it whole (else in ns).
fn whole_unit(duration: Duration) -> String {
    let ns = duration.as_nanos();
    match ns {
        0 => "0s".into(),
        _ if ns.is_multiple_of(1_000_000_000) => format!("{}s", ns / 1_000_000_000),
        _ if ns.is_multiple_of(1_000_000) => format!("{}ms", ns / 1_000_000),
        _ if ns.is_multiple_of(1_000) => format!("{}us", ns / 1_000),
        _ => format!("{ns}ns"),
    }
}

impl ExitDelay {
    /// The wait to add after an exit whose handling took `handling`.
    fn extra(&self, handling: Duration) -> Duration {
        match self.cost {
            ExtraCost::Fixed(extra) => extra,
            ExtraCost::Scaled(factor) => handling.mul_f64((factor - 1.0).max(0.0)),
        }
    }
}

/// An exit handled, not yet closed by the next entry.
struct Open {
    device: &'static str,
    vcpu: usize,
    at: Instant,
    in_guest: Duration,
    halted: Duration,
    logging_ns: u64,
}

/// The VM's stopwatch, driven from its run loop.
pub(crate) struct ExitClock {
    observer: Box<dyn ExitObserver>,
    delay: Option<ExitDelay>,
    entered: Instant,
    /// Guest time of entries that ended without an exit (kicks).
    in_guest: Duration,
    open: Option<Open>,
    run_delay: RunDelay,
    observing: Duration,
}

impl ExitClock {
    pub fn new(observer: Box<dyn ExitObserver>, delay: Option<ExitDelay>) -> Self {
        ExitClock {
            observer,
            delay,
            entered: Instant::now(),
            in_guest: Duration::ZERO,
            open: None,
            run_delay: RunDelay::open(),
            observing: Duration::ZERO,
        }
    }

    /// The guest is about to be entered: closes the last exit, waits the
    /// injected delay, and tells the observer.
    pub fn entering(&mut self, memory: &GuestMemory, logging_ns: u64) {
        if let Some(open) = self.open.take() {
            let logging = Duration::from_nanos(logging_ns.saturating_sub(open.logging_ns));
            let handling = |open: &Open| {
                open.at
                    .elapsed()
                    .saturating_sub(open.halted)
                    .saturating_sub(logging)
            };
            let injected = match &self.delay {
                Some(delay) if delay.device == open.device => wait(delay.extra(handling(&open))),
                _ => Duration::ZERO,
            };
            // Read after the wait: the exit's whole cost, on the same clock
            // whether or not the VMM added to it.
            let handling = handling(&open);
            let timing = ExitTiming {
                device: open.device,
                vcpu: open.vcpu,
                in_guest: open.in_guest,
                handling,
                halted: open.halted,
                logging,
                injected,
                run_delay: self.run_delay.sample(),
                observing: self.observing,
            };
            let start = Instant::now();
            self.observer.exit(&timing, memory);
            self.observing = start.elapsed();
        }
        self.entered = Instant::now();
    }

    /// KVM_RUN returned without an exit to handle (a kick, a debug stop).
    pub fn resumed_without_exit(&mut self) {
        self.in_guest += self.entered.elapsed();
    }

    /// KVM_RUN returned with vCPU `vcpu`'s exit to `device`.
    pub fn exited(&mut self, device: &'static str, vcpu: usize, logging_ns: u64) {
        let at = Instant::now();
        let in_guest = std::mem::take(&mut self.in_guest) + (at - self.entered);
        self.open = Some(Open {
            device,
            vcpu,
            at,
            in_guest,
            halted: Duration::ZERO,
            logging_ns,
        });
    }

    /// The guest was halted for `waited` after the open exit.
    pub fn halted(&mut self, waited: Duration) {
        if let Some(open) = &mut self.open {
            open.halted += waited;
        }
    }
}

/// Waits `duration` on purpose, precisely, by spinning: a sleeping thread
/// wakes tens of microseconds late on an idle host and milliseconds late
/// on a busy one (it must wait for a CPU again), which would add to every
/// delay. Returns how long it waited.
fn wait(duration: Duration) -> Duration {
    let start = Instant::now();
    let until = start + duration;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    start.elapsed()
}

/// The calling thread's run delay, from /proc/thread-self/schedstat (its
/// second field: nanoseconds spent runnable on a run queue). Absent where
/// the kernel keeps no scheduler statistics: then always 0.
struct RunDelay {
    file: Option<File>,
    last_ns: u64,
    sampled: Instant,
}

impl RunDelay {
    fn open() -> Self {
        let mut delay = RunDelay {
            file: File::open("/proc/thread-self/schedstat").ok(),
            last_ns: 0,
            sampled: Instant::now(),
        };
        delay.last_ns = delay.read().unwrap_or(0);
        delay
    }

    fn read(&self) -> Option<u64> {
        let mut buf = [0u8; 96];
        let len = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        parse_run_delay(&buf[..len])
    }

    /// The run delay since the last sample, if a period has passed.
    fn sample(&mut self) -> Duration {
        if self.sampled.elapsed() < RUN_DELAY_PERIOD {
            return Duration::ZERO;
        }
        self.sampled = Instant::now();
        let Some(now) = self.read() else {
            return Duration::ZERO;
        };
        let delta = now.saturating_sub(self.last_ns);
        self.last_ns = now;
        Duration::from_nanos(delta)
    }
}

/// The second of schedstat's three fields.
fn parse_run_delay(schedstat: &[u8]) -> Option<u64> {
    std::str::from_utf8(schedstat)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether this host keeps the scheduler statistics run delay is read from.
pub fn run_delay_available() -> bool {
    RunDelay::open().read().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_delay_is_schedstats_second_field() {
        assert_eq!(parse_run_delay(b"123 456 7\n"), Some(456));
        assert_eq!(parse_run_delay(b"123\n"), None);
    }

    #[test]
    fn a_scaled_delay_adds_the_handling_time_times_the_factor_less_one() {
        let delay = |cost| ExitDelay {
            device: "virtio-blk".into(),
            cost,
        };
        let handling = Duration::from_micros(30);
        assert_eq!(
            delay(ExtraCost::Scaled(2.0)).extra(handling),
            Duration::from_micros(30)
        );
        assert_eq!(
            delay(ExtraCost::Fixed(Duration::from_millis(2))).extra(handling),
            Duration::from_millis(2)
        );
    }

    #[test]
    fn a_delay_is_written_in_its_largest_whole_unit() {
        let delay = |cost| ExitDelay {
            device: "virtio-blk".into(),
            cost,
        };
        let fixed = |duration| delay(ExtraCost::Fixed(duration)).to_string();
        assert_eq!(fixed(Duration::from_micros(200)), "virtio-blk=+200us");
        assert_eq!(fixed(Duration::from_millis(2)), "virtio-blk=+2ms");
        assert_eq!(fixed(Duration::from_nanos(1500)), "virtio-blk=+1500ns");
        assert_eq!(delay(ExtraCost::Scaled(2.5)).to_string(), "virtio-blk=x2.5");
    }

    #[test]
    fn an_injected_wait_lasts_at_least_its_duration() {
        for micros in [50, 500] {
            let waited = wait(Duration::from_micros(micros));
            assert!(waited >= Duration::from_micros(micros), "{waited:?}");
        }
    }
}
