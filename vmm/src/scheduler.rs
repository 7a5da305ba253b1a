//! Serialised vCPUs: which of a guest's vCPUs runs, one at a time.
//!
//! provm records an N-vCPU guest without a PMU by running exactly one vCPU
//! at a time on one host thread and switching only at VM exits that reach
//! the VMM. Which vCPU runs after an exit is this module's policy; the VM
//! asks its seam to confirm each switch, so that a recording logs it and a
//! replay follows the log (`Seam::schedule`).
//!
//! The policy: a vCPU runs for a quantum of exits, then the next runnable
//! one (round robin) gets its turn; a vCPU that spins (the guest kernel's
//! `cpu_relax()` exits, kernels/smp) or halts gives up its turn at once.
//! With a chaos seed the quantum and the next vCPU are drawn from a seeded
//! generator instead, so that different seeds interleave the guest's
//! threads differently (as rr's chaos mode does).

use rand_core::{Rng, SeedableRng};
use rand_xorshift::XorShiftRng;
use serde::{Deserialize, Serialize};

/// Exits a vCPU runs for before the next one gets its turn.
pub const QUANTUM: u32 = 64;
/// A chaos quantum is drawn from 1 to this.
const CHAOS_QUANTUM_MAX: u32 = 256;

/// Why the running vCPU exited, as far as scheduling cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Exit,
    /// The guest kernel waits for another CPU (`cpu_relax()`).
    Spin,
    /// HLT; `for_good` with interrupts off (only an NMI would wake it).
    Halt {
        for_good: bool,
    },
}

/// The policy's answer after an exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Stay,
    Switch(usize),
    /// Nothing can run: every started vCPU halted, none with an interrupt.
    AllHalted,
}

/// One vCPU, as the scheduler sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuRun {
    /// Started (the BSP from boot, an AP once the guest woke it).
    pub started: bool,
    pub halted: bool,
    pub halted_for_good: bool,
}

/// What a snapshot keeps of the scheduler: enough to go on identically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerState {
    pub current: usize,
    pub cpus: Vec<CpuRun>,
    pub exits_left: u32,
}

pub struct Scheduler {
    state: SchedulerState,
    chaos: Option<XorShiftRng>,
}

impl Scheduler {
    /// `cpus` vCPUs, vCPU 0 running.
    pub fn new(cpus: usize) -> Self {
        let mut run = vec![CpuRun::default(); cpus];
        run[0].started = true;
        Scheduler {
            state: SchedulerState {
                current: 0,
                cpus: run,
                exits_left: QUANTUM,
            },
            chaos: None,
        }
    }

    pub fn restore(state: SchedulerState) -> Self {
        Scheduler { state, chaos: None }
    }

    pub fn save(&self) -> SchedulerState {
        self.state.clone()
    }

    /// Draws quanta and switches from `seed` from now on.
    pub fn chaos(&mut self, seed: u64) {
        let mut rng = XorShiftRng::seed_from_u64(seed);
        self.state.exits_left = chaos_quantum(&mut rng);
        self.chaos = Some(rng);
    }

    pub fn current(&self) -> usize {
        self.state.current
    }

    pub fn cpus(&self) -> usize {
        self.state.cpus.len()
    }

    pub fn started(&self, cpu: usize) -> bool {
        self.state.cpus[cpu].started
    }

    pub fn start(&mut self, cpu: usize) {
        self.state.cpus[cpu] = CpuRun {
            started: true,
            ..CpuRun::default()
        };
    }

    pub fn halted(&self, cpu: usize) -> bool {
        self.state.cpus[cpu].halted
    }

    /// The vCPU woke (it is taking an interrupt, or runs on after HLT).
    pub fn woke(&mut self, cpu: usize) {
        let run = &mut self.state.cpus[cpu];
        run.halted = false;
        run.halted_for_good = false;
    }

    /// Makes `cpu` the running vCPU, with a fresh quantum.
    pub fn switched(&mut self, cpu: usize) {
        self.state.current = cpu;
        self.state.exits_left = match &mut self.chaos {
            Some(rng) => chaos_quantum(rng),
            None => QUANTUM,
        };
    }

    /// After an exit of the running vCPU: who runs next. `interrupt_waits`
    /// says whether an interrupt waits for a vCPU (which wakes it).
    pub fn after_exit(&mut self, reason: Reason, interrupt_waits: impl Fn(usize) -> bool) -> Next {
        let current = self.state.current;
        let give_up = match reason {
            Reason::Exit => {
                self.state.exits_left = self.state.exits_left.saturating_sub(1);
                self.state.exits_left == 0
            }
            Reason::Spin => true,
            Reason::Halt { for_good } => {
                let run = &mut self.state.cpus[current];
                run.halted = true;
                run.halted_for_good = for_good;
                true
            }
        };
        if !give_up {
            return Next::Stay;
        }
        let runnable = |cpu: usize| {
            let run = self.state.cpus[cpu];
            run.started && !run.halted_for_good && (!run.halted || interrupt_waits(cpu))
        };
        let count = self.state.cpus.len();
        let others: Vec<usize> = (1..count)
            .map(|step| (current + step) % count)
            .filter(|&cpu| runnable(cpu))
            .collect();
        let pick = match (&mut self.chaos, others.is_empty()) {
            (_, true) => None,
            (Some(rng), false) => Some(others[(rng.next_u32() as usize) % others.len()]),
            (None, false) => Some(others[0]),
        };
        match pick {
            Some(cpu) => Next::Switch(cpu),
            None if runnable(current) => {
                self.state.exits_left = QUANTUM;
                Next::Stay
            }
            None => Next::AllHalted,
        }
    }
}

fn chaos_quantum(rng: &mut XorShiftRng) -> u32 {
    1 + rng.next_u32() % CHAOS_QUANTUM_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none_waiting(_: usize) -> bool {
        false
    }

    #[test]
    fn a_quantum_of_exits_then_the_next_started_vcpu() {
        let mut scheduler = Scheduler::new(3);
        scheduler.start(2);
        for _ in 1..QUANTUM {
            assert_eq!(scheduler.after_exit(Reason::Exit, none_waiting), Next::Stay);
        }
        // vCPU 1 has not started: 2 is next.
        assert_eq!(
            scheduler.after_exit(Reason::Exit, none_waiting),
            Next::Switch(2)
        );
    }

    #[test]
    fn spinning_and_halting_give_the_turn_away() {
        let mut scheduler = Scheduler::new(2);
        // Alone, a spinning vCPU goes on.
        assert_eq!(scheduler.after_exit(Reason::Spin, none_waiting), Next::Stay);
        scheduler.start(1);
        assert_eq!(
            scheduler.after_exit(Reason::Spin, none_waiting),
            Next::Switch(1)
        );
        scheduler.switched(1);
        let halt = Reason::Halt { for_good: false };
        // vCPU 0 is not halted: it runs.
        assert_eq!(scheduler.after_exit(halt, none_waiting), Next::Switch(0));
        scheduler.switched(0);
        assert_eq!(scheduler.after_exit(halt, none_waiting), Next::AllHalted);
        // An IPI for vCPU 1 makes it runnable.
        assert_eq!(scheduler.after_exit(halt, |cpu| cpu == 1), Next::Switch(1));
    }

    #[test]
    fn a_chaos_seed_fixes_the_schedule() {
        let schedule = |seed: u64| {
            let mut scheduler = Scheduler::new(4);
            (1..4).for_each(|cpu| scheduler.start(cpu));
            scheduler.chaos(seed);
            let mut switches = Vec::new();
            for _ in 0..2000 {
                if let Next::Switch(cpu) = scheduler.after_exit(Reason::Exit, none_waiting) {
                    scheduler.switched(cpu);
                    switches.push(cpu);
                }
            }
            switches
        };
        assert_eq!(schedule(7), schedule(7));
        assert_ne!(schedule(7), schedule(8));
    }
}
