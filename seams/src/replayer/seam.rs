//! The crossings: every input the replayed guest asks for comes from the
//! log, and every output it makes is compared with the log.

use std::time::Instant;

use provm_trace::events::{self, Event};
use provm_vmm::clock::Clock;
use provm_vmm::seam::{Delivery, Exit, Instance, LoggedStop, Place, Seam};
use provm_vmm::state_digest::{MemoryDigest, StateDigest};

use super::{Replayer, State};
use crate::exit_event;

impl Clock for Replayer {
    fn monotonic_ns(&self) -> u64 {
        match self.expect(
            || "a clock reading".into(),
            |e| matches!(e, Event::Clock(_)),
        ) {
            Some(Event::Clock(ns)) => ns,
            _ => self.position().guest_ns,
        }
    }

    fn wall_ns(&self) -> u64 {
        match self.expect(
            || "a wall-clock reading".into(),
            |e| matches!(e, Event::Wall(_)),
        ) {
            Some(Event::Wall(ns)) => ns,
            _ => 0,
        }
    }
}

impl Seam for Replayer {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    /// The next event, if it is a preemption, or a window exit where the
    /// recording waited at window exits.
    fn logged_stop(&self) -> Option<LoggedStop> {
        let place = |at: &events::Place| Place {
            rip: at.rip,
            registers: at.registers,
        };
        match self.state.lock().unwrap().cursor.peek() {
            Some(Event::Preempted {
                at,
                pages,
                instance,
                ran_ns,
                user_code,
            }) => Some(LoggedStop::Preemption(
                place(at),
                Instance {
                    pages: pages.clone(),
                    digest: *instance,
                    ran_ns: *ran_ns,
                    user_code: *user_code,
                },
            )),
            Some(Event::InterruptWindow { at }) if self.delivery == Delivery::LoggedWindow => {
                Some(LoggedStop::Window(place(at)))
            }
            _ => None,
        }
    }

    /// The logged clock says when the guest woke: no need to wait.
    fn wait_until(&self, _: u64, _: Instant) {}

    fn exit(&self, exit: Exit<'_>, at: Place) {
        self.state.lock().unwrap().cursor.restart_exitless();
        let actual = exit_event(exit, at);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn read_result(&self, data: &[u8]) {
        let actual = Event::ReadResult(data.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn injected(&self, vector: u8) {
        let actual = Event::Inject(vector);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    /// Where the recording switched vCPUs, the replay does, to the vCPU it
    /// did: the schedule is the log's. A switch the log has at another
    /// exit shows as the next exit differing, on the vCPU named.
    fn schedule(&self, _proposed: Option<usize>) -> Option<usize> {
        let next = self.state.lock().unwrap().cursor.peek().cloned();
        let Some(Event::Switch(cpu)) = next else {
            return None;
        };
        self.expect(|| format!("switch to vCPU {cpu}"), |_| true)
            .map(|_| usize::from(cpu))
    }

    fn agent_input(&self, bytes: &[u8]) {
        let actual = Event::AgentInput(bytes.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn agent_output(&self, bytes: &[u8]) {
        let actual = Event::AgentOutput(bytes.to_vec());
        self.expect(|| actual.to_string(), |e| *e == actual);
        let mut state = self.state.lock().unwrap();
        if let Some(exit_status) = state.agent.exit_status_in(bytes) {
            state.checks.agent_finished(exit_status);
        }
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        self.state.lock().unwrap().checks.disk_write(offset, data);
        let actual = Event::disk_write(offset, data);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    fn net_send(&self, frame: &[u8]) {
        let actual = Event::net_sent(frame);
        self.expect(|| actual.to_string(), |e| *e == actual);
    }

    /// The frame the recording received here, if it received one: the
    /// replay needs no network.
    fn net_receive(&self) -> Option<Vec<u8>> {
        let next_is_frame = matches!(
            self.state.lock().unwrap().cursor.peek(),
            Some(Event::NetReceived(_))
        );
        if !next_is_frame {
            return None;
        }
        let frame = self.expect(
            || "a network frame".into(),
            |e| matches!(e, Event::NetReceived(_)),
        );
        match frame {
            Some(Event::NetReceived(frame)) => Some(frame),
            _ => None,
        }
    }

    /// Also stops at the end of the log: a recording cut short (timeout,
    /// Ctrl-C, a spinning guest) ends between two exits, and the replay
    /// must stop there too rather than run on unchecked. Checked at every
    /// exit and every kick of the vCPU.
    fn stop_reason(&self) -> Option<String> {
        let mut state = self.state.lock().unwrap();
        let State { cursor, checks, .. } = &mut *state;
        if let Some(error) = cursor.error() {
            return Some(error.to_owned());
        }
        if !checks.diverged() {
            if let Some(spins) = cursor.spinning(checks.recorded().exitless_limit) {
                checks.diverge(spins);
            }
        }
        if checks.diverged() {
            return Some("the replay diverged".into());
        }
        cursor.at_end().then(|| "the end of the log".into())
    }

    fn rolled_back(&self) {
        self.state.lock().unwrap().cursor.restart_exitless();
    }

    fn passed_logged_stop(&self) {
        self.state.lock().unwrap().cursor.passed_logged_stop();
    }

    /// A recording's host sends between runs of the VM, after an exit; a
    /// fork's live part may send where the replayed part paused (see
    /// `fork`).
    fn host_input_due(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        matches!(state.cursor.peek(), Some(Event::AgentInput(_)))
    }

    fn disk_access_fails(&self, _write: bool) -> bool {
        let mut disk_error = self.disk_error.lock().unwrap();
        disk_error.1 += 1;
        disk_error.0 == Some(disk_error.1)
    }

    /// Where the log has a memory check next: the recorder took one at
    /// this exit.
    fn memory_check_due(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        !state.checks.diverged() && matches!(state.cursor.peek(), Some(Event::StateCheck { .. }))
    }

    fn memory_checked(&self, digest: MemoryDigest) {
        let event = self.position().events;
        let whole = digest.whole;
        let actual = Event::StateCheck { memory: whole };
        let matched = self.expect(
            || format!("state check at event {event}: memory differs (digest {whole:016x})"),
            |e| *e == actual,
        );
        let checks = &mut self.state.lock().unwrap().checks;
        if matched.is_some() {
            checks.state_check_matched();
        } else {
            checks.memory_differs(event, &digest.pieces);
        }
    }

    fn final_check_due(&self) -> bool {
        let state = self.state.lock().unwrap();
        state.checks.recorded().final_check.is_some()
    }

    fn final_state(&self, digest: &StateDigest) {
        self.state.lock().unwrap().checks.final_state(digest);
    }

    fn pause_here(&self) -> bool {
        self.state.lock().unwrap().cursor.pause_here()
    }
}
