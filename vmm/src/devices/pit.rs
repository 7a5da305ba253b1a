//! The Intel 8254 programmable interval timer at ports 0x40-0x43.
//!
//! Counters are not ticked: each one remembers when its count was loaded and
//! computes its state from the `Clock` (1.193182 MHz input), so the PIT costs
//! nothing between exits and is a pure function of the times it is given.
//! Counter 0's OUT drives IRQ 0: the vCPU loop arms a timer for
//! `next_deadline_ns` and calls `poll`, which says when to pulse the line.
//!
//! Modelled: the counter latch command, lobyte/hibyte/both access with its
//! flip-flop, and modes 0 (interrupt on terminal count), 2 (rate generator),
//! 3 (square wave) and 4 (software strobe), the ones Linux's i8253 drivers
//! use. Not modelled: BCD counting, the read-back command, and the gates.
//! Counters 0 and 1 have their gates tied high on a PC; counter 2's gate and
//! OUT are bits 0 and 5 of port 0x61, which only Linux's PIT TSC calibration
//! (skipped: the guest has no TSC) and PC speaker touch, so no port 0x61.
//! Gate-triggered modes 1 and 5 therefore never start counting. Only the
//! count raises IRQ 0: OUT's jump to its initial level at a control word (a
//! rising edge if OUT was low) does not, as in QEMU.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::persist::{require, InvalidState, Persist};
use crate::bus::BusDevice;
use crate::clock::Clock;

pub const PIT_PORT: u64 = 0x40;
pub const PIT_PORT_LEN: u64 = 4;

/// How a refused saved state names the device.
const STATE_NAME: &str = "PIT";
const INPUT_HZ: u128 = 1_193_182;
const NS_PER_S: u128 = 1_000_000_000;

/// Whole input clock cycles in `ns` nanoseconds.
fn ticks_in(ns: u64) -> u64 {
    (u128::from(ns) * INPUT_HZ / NS_PER_S) as u64
}

/// Nanoseconds until the input clock has completed `ticks` cycles: the least
/// `ns` for which `ticks_in(ns) >= ticks`.
fn ns_until(ticks: u64) -> u64 {
    (u128::from(ticks) * NS_PER_S).div_ceil(INPUT_HZ) as u64
}

/// How the counter's 16 bits travel through the 8-bit port (control word
/// bits 5-4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Access {
    Low,
    High,
    #[default]
    Both,
}

#[derive(Default, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Counter {
    mode: u8,
    access: Access,
    /// The initial count last written; 0 stands for 65536.
    initial: u16,
    /// When counting started: the load of the initial count. `None` after a
    /// control word until a count is written, or if the mode waits for a gate.
    started_ns: Option<u64>,
    /// Input cycles after the start at which OUT next rises.
    next_edge: Option<u64>,
    /// Write flip-flop: the low byte of a two-byte count, awaiting the high.
    low_byte: Option<u8>,
    /// Read flip-flop: the next two-byte read returns the high byte.
    read_high: bool,
    /// A count held by the latch command until read out in full.
    latched: Option<u16>,
}

impl Counter {
    /// The count as a cycle count: 0 means 65536.
    fn period(&self) -> u64 {
        match self.initial {
            0 => 0x10000,
            n => u64::from(n),
        }
    }

    fn write_control(&mut self, value: u8, now_ns: u64) {
        let access = match (value >> 4) & 3 {
            0 => {
                // Counter latch command; a second one before the first
                // latched count is read is ignored (8254 datasheet).
                if self.latched.is_none() {
                    self.latched = Some(self.count(now_ns));
                }
                return;
            }
            1 => Access::Low,
            2 => Access::High,
            _ => Access::Both,
        };
        // A control word resets the counter's logic; counting waits for a
        // new count. Modes 6 and 7 are aliases of 2 and 3.
        *self = Counter {
            mode: match (value >> 1) & 7 {
                m @ 6..=7 => m - 4,
                m => m,
            },
            access,
            initial: self.initial,
            ..Counter::default()
        };
    }

    fn write_count(&mut self, value: u8, now_ns: u64) {
        match (self.access, self.low_byte.take()) {
            (Access::Low, _) => self.load(u16::from(value), now_ns),
            (Access::High, _) => self.load(u16::from(value) << 8, now_ns),
            (Access::Both, Some(low)) => self.load(u16::from_le_bytes([low, value]), now_ns),
            (Access::Both, None) => {
                self.low_byte = Some(value);
                // Mode 0: "writing the first byte disables counting".
                if self.mode == 0 {
                    self.started_ns = None;
                    self.next_edge = None;
                }
            }
        }
    }

    /// Loads a new initial count and starts counting from it at once, as the
    /// 8254 does in modes 0 and 4 (Linux's one-shot timer rewrites the count
    /// for each event). The one-cycle load delay is ignored, and so is the
    /// deferral of a new count to the end of the current period in modes 2 and
    /// 3: Linux writes a control word first, which stops the counter anyway.
    fn load(&mut self, initial: u16, now_ns: u64) {
        self.initial = initial;
        let period = self.period();
        (self.started_ns, self.next_edge) = match self.mode {
            0 | 2 | 3 => (Some(now_ns), Some(period)),
            // OUT pulses low for one cycle at terminal count, rising after it.
            4 => (Some(now_ns), Some(period + 1)),
            _ => (None, None),
        };
    }

    /// The value in the counting element at `now_ns` (a stopped counter
    /// shows its initial count).
    fn count(&self, now_ns: u64) -> u16 {
        let Some(started) = self.started_ns else {
            return self.initial;
        };
        let elapsed = ticks_in(now_ns.saturating_sub(started));
        let period = self.period();
        let count = match self.mode {
            2 => period - elapsed % period,
            // Counts down by two, twice per period (exact for even counts).
            3 => (period & !1) - 2 * (elapsed % (period / 2).max(1)),
            // Modes 0 and 4 wrap past zero and keep counting.
            _ => period.wrapping_sub(elapsed),
        };
        count as u16
    }

    fn read(&mut self, now_ns: u64) -> u8 {
        let count = self.latched.unwrap_or_else(|| self.count(now_ns));
        let [low, high] = count.to_le_bytes();
        let (byte, done) = match self.access {
            Access::Low => (low, true),
            Access::High => (high, true),
            Access::Both if self.read_high => (high, true),
            Access::Both => (low, false),
        };
        self.read_high = !done;
        if done {
            self.latched = None;
        }
        byte
    }

    fn deadline_ns(&self) -> Option<u64> {
        Some(self.started_ns? + ns_until(self.next_edge?))
    }

    /// Refuses what no sequence of port writes reaches: a mode past 5 (6 and
    /// 7 are stored as 2 and 3), a gate-triggered mode counting, an edge
    /// without a start, or one too far away to be a time.
    fn validate(&self, index: usize) -> Result<(), InvalidState> {
        let field = |f: &str| format!("counters[{index}].{f}");
        require(
            self.mode <= 5,
            STATE_NAME,
            field("mode"),
            self.mode,
            "the 8254 has modes 0-5",
        )?;
        require(
            self.started_ns.is_none() || !matches!(self.mode, 1 | 5),
            STATE_NAME,
            field("started_ns"),
            format!("{:?}", self.started_ns),
            "gate-triggered modes never start counting here",
        )?;
        let Some(edge) = self.next_edge else {
            return Ok(());
        };
        let in_time = self.started_ns.is_some_and(|started| {
            edge <= ticks_in(u64::MAX) && started.checked_add(ns_until(edge)).is_some()
        });
        require(
            in_time,
            STATE_NAME,
            field("next_edge"),
            edge,
            "no edge of a stopped counter, or past the end of the clock",
        )
    }

    /// Whether OUT has risen since the last poll; if so, schedules the next
    /// rise. A periodic counter's next rise is the first one after `now_ns`:
    /// periods missed since the last poll coalesce into the one edge reported
    /// now (so with a jiffies clocksource a late poll loses guest time).
    fn poll(&mut self, now_ns: u64) -> bool {
        let (Some(started), Some(edge)) = (self.started_ns, self.next_edge) else {
            return false;
        };
        let elapsed = ticks_in(now_ns.saturating_sub(started));
        if elapsed < edge {
            return false;
        }
        let period = self.period();
        self.next_edge = matches!(self.mode, 2 | 3).then(|| (elapsed / period + 1) * period);
        true
    }
}

pub struct Pit {
    clock: Arc<dyn Clock>,
    counters: [Counter; 3],
}

/// The three counters, with times in the VM's monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PitState {
    counters: [Counter; 3],
}

impl Pit {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Pit {
            clock,
            counters: Default::default(),
        }
    }

    /// Monotonic time (as the `Clock` gives it) at which IRQ 0 next rises, if
    /// counter 0 is counting towards an edge. Changes when the guest programs
    /// the PIT and after each `poll` that returns true.
    pub fn next_deadline_ns(&self) -> Option<u64> {
        self.counters[0].deadline_ns()
    }

    /// Whether IRQ 0 has had a rising edge since the last poll: if so the
    /// caller pulses IRQ 0 once. `now_ns` is `Clock::monotonic_ns` time.
    pub fn poll(&mut self, now_ns: u64) -> bool {
        self.counters[0].poll(now_ns)
    }
}

impl Persist for Pit {
    type State = PitState;

    fn save(&self) -> PitState {
        PitState {
            counters: self.counters.clone(),
        }
    }

    fn restore(&mut self, state: &PitState) -> Result<(), InvalidState> {
        for (index, counter) in state.counters.iter().enumerate() {
            counter.validate(index)?;
        }
        self.counters = state.counters.clone();
        Ok(())
    }
}

impl BusDevice for Pit {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let now = self.clock.monotonic_ns();
        data.fill(0);
        // The control word register, offset 3, is write-only.
        let counter = self.counters.get_mut(offset as usize);
        if let (Some(counter), Some(byte)) = (counter, data.first_mut()) {
            *byte = counter.read(now);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        let now = self.clock.monotonic_ns();
        match offset {
            0..=2 => self.counters[offset as usize].write_count(value, now),
            _ => match usize::from(value >> 6) {
                3 => {} // Read-back command: not used by Linux.
                channel => self.counters[channel].write_control(value, now),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Monotonic time set by the test.
    #[derive(Default)]
    struct FakeClock(AtomicU64);

    impl FakeClock {
        fn set(&self, ns: u64) {
            self.0.store(ns, Ordering::SeqCst);
        }
    }

    impl Clock for FakeClock {
        fn monotonic_ns(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }

        fn wall_ns(&self) -> u64 {
            0
        }
    }

    fn pit() -> (Pit, Arc<FakeClock>) {
        let clock = Arc::new(FakeClock::default());
        (Pit::new(clock.clone()), clock)
    }

    fn outb(pit: &mut Pit, port: u64, value: u8) {
        pit.write(port - PIT_PORT, &[value]);
    }

    fn inb(pit: &mut Pit, port: u64) -> u8 {
        let mut data = [0xaa];
        pit.read(port - PIT_PORT, &mut data);
        data[0]
    }

    /// Reads counter `port` the way Linux's i8253 clocksource does: latch
    /// command, then low and high byte.
    fn latched_count(pit: &mut Pit, port: u64) -> u16 {
        outb(pit, 0x43, ((port - PIT_PORT) as u8) << 6);
        u16::from_le_bytes([inb(pit, port), inb(pit, port)])
    }

    /// Linux's HZ=100 periodic tick: mode 2, LATCH = 11932.
    fn program_periodic_tick(pit: &mut Pit) {
        outb(pit, 0x43, 0x34);
        outb(pit, 0x40, 0x9c);
        outb(pit, 0x40, 0x2e);
    }

    /// ns_until(11932): one HZ=100 tick.
    const TICK_NS: u64 = 10_000_151;

    #[test]
    fn cycle_conversions_round_trip() {
        assert_eq!(ns_until(11932), TICK_NS);
        assert_eq!(ticks_in(TICK_NS), 11932);
        assert_eq!(ticks_in(TICK_NS - 1), 11931);
        assert_eq!(ns_until(1), 839);
    }

    #[test]
    fn nothing_is_due_before_programming() {
        let (mut pit, _) = pit();
        assert_eq!(pit.next_deadline_ns(), None);
        assert!(!pit.poll(u64::MAX));
    }

    #[test]
    fn mode_2_raises_irq0_every_period() {
        let (mut pit, clock) = pit();
        clock.set(1000);
        program_periodic_tick(&mut pit);
        let first = 1000 + TICK_NS;
        assert_eq!(pit.next_deadline_ns(), Some(first));
        assert!(!pit.poll(first - 1));
        assert!(pit.poll(first));
        assert!(!pit.poll(first));
        assert_eq!(pit.next_deadline_ns(), Some(1000 + ns_until(2 * 11932)));
    }

    #[test]
    fn late_poll_coalesces_missed_periods_into_one_edge() {
        let (mut pit, _) = pit();
        program_periodic_tick(&mut pit);
        assert!(pit.poll(3 * TICK_NS + TICK_NS / 2));
        assert!(!pit.poll(3 * TICK_NS + TICK_NS / 2));
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(4 * 11932)));
    }

    #[test]
    fn count_is_computed_from_elapsed_time() {
        let (mut pit, clock) = pit();
        program_periodic_tick(&mut pit);
        assert_eq!(latched_count(&mut pit, 0x40), 11932);
        clock.set(5_000_000);
        assert_eq!(latched_count(&mut pit, 0x40), 11932 - 5965);
        // Mode 2 reloads at the end of each period.
        clock.set(TICK_NS + 5_000_000);
        assert_eq!(latched_count(&mut pit, 0x40), 11932 - 5965);
    }

    #[test]
    fn latch_holds_the_count_until_both_bytes_are_read() {
        let (mut pit, clock) = pit();
        program_periodic_tick(&mut pit);
        clock.set(5_000_000);
        outb(&mut pit, 0x43, 0x00);
        clock.set(6_000_000);
        // A second latch before the first is read out is ignored.
        outb(&mut pit, 0x43, 0x00);
        assert_eq!(inb(&mut pit, 0x40), (5967 & 0xff) as u8);
        clock.set(7_000_000);
        assert_eq!(inb(&mut pit, 0x40), (5967 >> 8) as u8);
        // Released: reads follow the count again.
        let live = u16::from_le_bytes([inb(&mut pit, 0x40), inb(&mut pit, 0x40)]);
        assert_eq!(live, 11932 - 8352);
    }

    #[test]
    fn count_zero_means_65536() {
        let (mut pit, clock) = pit();
        outb(&mut pit, 0x43, 0x34);
        outb(&mut pit, 0x40, 0);
        outb(&mut pit, 0x40, 0);
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(65536)));
        assert_eq!(latched_count(&mut pit, 0x40), 0);
        clock.set(ns_until(1));
        assert_eq!(latched_count(&mut pit, 0x40), 0xffff);
    }

    #[test]
    fn control_word_resets_the_write_flip_flop() {
        let (mut pit, _) = pit();
        outb(&mut pit, 0x43, 0x34);
        outb(&mut pit, 0x40, 0x12);
        program_periodic_tick(&mut pit);
        assert_eq!(pit.next_deadline_ns(), Some(TICK_NS));
    }

    #[test]
    fn single_byte_access_modes() {
        let (mut pit, clock) = pit();
        // Low byte only, mode 0.
        outb(&mut pit, 0x43, 0x10);
        outb(&mut pit, 0x40, 0x80);
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(0x80)));
        clock.set(ns_until(0x10));
        assert_eq!(inb(&mut pit, 0x40), 0x70);
        assert_eq!(inb(&mut pit, 0x40), 0x70, "no flip-flop");
        // High byte only.
        outb(&mut pit, 0x43, 0x20);
        outb(&mut pit, 0x40, 0x01);
        assert_eq!(
            pit.next_deadline_ns(),
            Some(ns_until(0x10) + ns_until(0x100))
        );
        assert_eq!(inb(&mut pit, 0x40), 0x01);
    }

    #[test]
    fn mode_4_fires_once_and_rearms_on_a_new_count() {
        let (mut pit, clock) = pit();
        // Linux's oneshot clockevent: 0x38, then a count per event.
        outb(&mut pit, 0x43, 0x38);
        assert_eq!(pit.next_deadline_ns(), None, "waits for a count");
        outb(&mut pit, 0x40, 100);
        outb(&mut pit, 0x40, 0);
        // OUT strobes low at zero and rises one cycle later.
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(101)));
        assert!(!pit.poll(ns_until(101) - 1));
        assert!(pit.poll(ns_until(101)));
        assert_eq!(pit.next_deadline_ns(), None);
        assert!(!pit.poll(u64::MAX));
        clock.set(1_000_000);
        outb(&mut pit, 0x40, 100);
        outb(&mut pit, 0x40, 0);
        assert_eq!(pit.next_deadline_ns(), Some(1_000_000 + ns_until(101)));
    }

    #[test]
    fn mode_0_fires_at_terminal_count_then_wraps() {
        let (mut pit, clock) = pit();
        outb(&mut pit, 0x43, 0x30);
        outb(&mut pit, 0x40, 10);
        outb(&mut pit, 0x40, 0);
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(10)));
        clock.set(ns_until(12));
        assert!(pit.poll(ns_until(12)));
        assert_eq!(pit.next_deadline_ns(), None);
        assert_eq!(latched_count(&mut pit, 0x40), 0xfffe);
    }

    #[test]
    fn mode_0_stops_at_the_first_byte_of_a_new_count() {
        let (mut pit, clock) = pit();
        // Linux's pit_shutdown: mode 0, count 0.
        outb(&mut pit, 0x43, 0x30);
        outb(&mut pit, 0x40, 0);
        outb(&mut pit, 0x40, 0);
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(65536)));
        clock.set(1000);
        outb(&mut pit, 0x40, 0x34);
        assert_eq!(pit.next_deadline_ns(), None);
        clock.set(2000);
        outb(&mut pit, 0x40, 0x12);
        assert_eq!(pit.next_deadline_ns(), Some(2000 + ns_until(0x1234)));
    }

    #[test]
    fn mode_3_square_wave_counts_by_two_with_a_full_period() {
        let (mut pit, clock) = pit();
        outb(&mut pit, 0x43, 0x36);
        outb(&mut pit, 0x40, 0xe8);
        outb(&mut pit, 0x40, 0x03);
        clock.set(ns_until(1));
        assert_eq!(latched_count(&mut pit, 0x40), 998);
        clock.set(ns_until(501));
        assert_eq!(latched_count(&mut pit, 0x40), 998, "second half-period");
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(1000)));
        assert!(pit.poll(ns_until(1000)));
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(2000)));
    }

    #[test]
    fn modes_6_and_7_are_modes_2_and_3() {
        let (mut pit, _) = pit();
        outb(&mut pit, 0x43, 0x3c);
        outb(&mut pit, 0x40, 0x9c);
        outb(&mut pit, 0x40, 0x2e);
        assert!(pit.poll(TICK_NS));
        assert_eq!(pit.next_deadline_ns(), Some(ns_until(2 * 11932)));
    }

    #[test]
    fn gate_triggered_mode_never_starts() {
        let (mut pit, clock) = pit();
        outb(&mut pit, 0x43, 0x32);
        outb(&mut pit, 0x40, 100);
        outb(&mut pit, 0x40, 0);
        assert_eq!(pit.next_deadline_ns(), None);
        clock.set(1_000_000);
        assert_eq!(latched_count(&mut pit, 0x40), 100);
    }

    #[test]
    fn counter_2_counts_but_does_not_drive_irq0() {
        let (mut pit, clock) = pit();
        program_periodic_tick(&mut pit);
        outb(&mut pit, 0x43, 0xb4);
        outb(&mut pit, 0x42, 0xe8);
        outb(&mut pit, 0x42, 0x03);
        assert_eq!(pit.next_deadline_ns(), Some(TICK_NS));
        clock.set(ns_until(10));
        assert_eq!(latched_count(&mut pit, 0x42), 990);
        assert_eq!(latched_count(&mut pit, 0x40), 11922);
    }

    #[test]
    fn state_round_trips() {
        let (mut pit, clock) = pit();
        program_periodic_tick(&mut pit);
        clock.set(5_000_000);
        outb(&mut pit, 0x43, 0x00);
        inb(&mut pit, 0x40);
        let saved = pit.save();
        let (mut restored, _) = self::pit();
        restored.restore(&saved).unwrap();
        assert_eq!(restored.save(), saved);
        assert_eq!(restored.next_deadline_ns(), Some(TICK_NS));
    }

    #[test]
    fn restore_refuses_states_no_guest_reaches() {
        let (mut pit, _) = pit();
        program_periodic_tick(&mut pit);
        let good = pit.save();
        let refused = |edit: fn(&mut PitState)| {
            let mut state = good.clone();
            edit(&mut state);
            let (mut target, _) = self::pit();
            let error = target.restore(&state).unwrap_err();
            assert_eq!(target.next_deadline_ns(), None, "left unchanged");
            error
        };
        let error = refused(|s| s.counters[0].mode = 7);
        assert_eq!(error.field, "counters[0].mode");
        assert_eq!(error.value, "7");
        let error = refused(|s| s.counters[0].next_edge = Some(u64::MAX));
        assert_eq!(error.field, "counters[0].next_edge");
        let error = refused(|s| s.counters[1].next_edge = Some(5));
        assert_eq!(error.field, "counters[1].next_edge");
        let error = refused(|s| s.counters[0].mode = 5);
        assert_eq!(error.field, "counters[0].started_ns");
    }
}
