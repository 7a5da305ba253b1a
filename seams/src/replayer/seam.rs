//! The crossings: every input the replayed guest asks for comes from the
//! log, and every output it makes is compared with the log.

use std::time::Instant;

use provm_guest_agent::GuestMessage;
use provm_trace::events::{self, Event};
use provm_trace::page_digests::CheckPoint;
use provm_vmm::clock::Clock;
use provm_vmm::seam::{Delivery, Exit, Instance, LoggedStop, Place, Seam};
use provm_vmm::state_digest::{MemoryDigest, StateDigest};

use super::{Replayer, State};
use crate::exit_event;
use crate::state_check;

impl Clock for Replayer {
    fn monotonic_ns(&self) -> u64 {
        match self.expect(
            || "a clock reading".into(),
            |e| matches!(e, Event::Clock(_)),
        ) {
            Some(Event::Clock(ns)) => ns,
            _ => self.state.lock().unwrap().clock_ns,
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
        match self.state.lock().unwrap().events.peek() {
            Ok(Some(Event::Preempted {
                at,
                pages,
                instance,
            })) => Some(LoggedStop::Preemption(
                place(at),
                Instance {
                    pages: pages.clone(),
                    digest: *instance,
                },
            )),
            Ok(Some(Event::InterruptWindow { at })) if self.delivery == Delivery::LoggedWindow => {
                Some(LoggedStop::Window(place(at)))
            }
            _ => None,
        }
    }

    /// The logged clock says when the guest woke: no need to wait.
    fn wait_until(&self, _: u64, _: Instant) {}

    fn exit(&self, exit: Exit<'_>, at: Place) {
        self.state.lock().unwrap().last_exit = Instant::now();
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
        let next = self
            .state
            .lock()
            .unwrap()
            .events
            .peek()
            .ok()
            .flatten()
            .cloned();
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
        self.state.lock().unwrap().watch_agent(bytes);
    }

    fn disk_write(&self, offset: u64, data: &[u8]) {
        self.state.lock().unwrap().disk_writes.add(offset, data);
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
            self.state.lock().unwrap().events.peek(),
            Ok(Some(Event::NetReceived(_)))
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
        if let Some(error) = &state.error {
            return Some(error.clone());
        }
        state.check_spinning();
        if state.divergence.is_some() {
            return Some("the replay diverged".into());
        }
        state.at_end_of_log().then(|| "the end of the log".into())
    }

    /// A recording's host sends between runs of the VM, after an exit; a
    /// fork's live part may send where the replayed part paused (see
    /// `fork`).
    fn host_input_due(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        matches!(state.events.peek(), Ok(Some(Event::AgentInput(_))))
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
        state.divergence.is_none()
            && matches!(state.events.peek(), Ok(Some(Event::StateCheck { .. })))
    }

    fn memory_checked(&self, digest: MemoryDigest) {
        let event = self.position().events;
        let whole = digest.whole;
        let actual = Event::StateCheck { memory: whole };
        let matched = self.expect(
            || format!("state check at event {event}: memory differs (digest {whole:016x})"),
            |e| *e == actual,
        );
        let mut state = self.state.lock().unwrap();
        if matched.is_some() {
            state.state_checks += 1;
            return;
        }
        let pages = state.pages_differing(CheckPoint::Event(event), &digest.pieces);
        if let Some(divergence) = state.divergence.as_mut() {
            if divergence.event == event && divergence.actual.starts_with("state check") {
                divergence.pages = pages;
            }
        }
    }

    fn final_check_due(&self) -> bool {
        self.state.lock().unwrap().recorded.final_check.is_some()
    }

    fn final_state(&self, digest: &StateDigest) {
        let mut state = self.state.lock().unwrap();
        // Registers left unchecked need no search for an older trace's
        // TSC rate.
        let recorded = state.recorded.final_check.as_ref();
        let compared = recorded.filter(|_| !state.registers_unchecked);
        let replayed = state_check::replayed(digest, compared);
        state.final_check = Some(replayed);
        state.final_pieces = Some(digest.memory.pieces.clone());
    }

    fn pause_here(&self) -> bool {
        let mut state = self.state.lock().unwrap();
        state.pause_place = state.position;
        let due = state.pause_at.is_some_and(|event| state.position >= event);
        if due {
            state.pause_at = None;
        }
        due
    }
}

impl State {
    /// Notes the command's exit status when the agent's output reports it.
    /// A bad frame is said once; the output is still compared with the log.
    fn watch_agent(&mut self, bytes: &[u8]) {
        let already_broken = self.agent_frames.is_broken();
        self.agent_frames.push(bytes);
        loop {
            match self.agent_frames.next_frame() {
                Ok(Some((kind, payload))) => {
                    if let Ok(GuestMessage::Finished(outcome)) =
                        GuestMessage::decode(kind, &payload)
                    {
                        self.exit_status = Some(outcome.shell_status());
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    if !already_broken {
                        tracing::warn!(
                            "the agent's output cannot be read past a bad frame ({error}): \
                             the replay compares its bytes but cannot tell the command's exit status"
                        );
                    }
                    break;
                }
            }
        }
    }
}
