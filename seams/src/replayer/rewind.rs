//! Pausing a replay at a log event and putting it back at a checkpoint:
//! with the VM's snapshot taken there, time travel (gdb's reverse
//! execution, forks).

use std::collections::VecDeque;
use std::time::Instant;

use provm_guest_agent::FrameReader;
use provm_trace::event_log::{DiskWritesDigest, EventStream};
use provm_trace::events::Event;
use provm_trace::format::FormatError;

use super::{Position, Replayer};

impl Replayer {
    /// Pauses the replay at the first VM exit at or after log event
    /// `event` (`None`: no pause).
    pub fn pause_at(&self, event: Option<u64>) {
        self.state.lock().unwrap().pause_at = event;
    }

    /// The log position of the last place the replay could pause: right
    /// after the last VM exit (or where `rewind` put it). Between two exits
    /// the guest runs without touching the log, so this names the stretch
    /// a debug stop is in, and `pause_at` with it stops at that stretch's
    /// start.
    pub fn pause_place(&self) -> u64 {
        self.state.lock().unwrap().pause_place
    }

    /// Where the replay stands, to come back to with `rewind`. Take it at a
    /// pause, with the VM's snapshot.
    pub fn checkpoint(&self) -> Checkpoint {
        let state = self.state.lock().unwrap();
        Checkpoint {
            position: state.position,
            exits: state.exits,
            clock_ns: state.clock_ns,
            recent: state.recent.clone(),
            vcpu: state.vcpu,
            disk_writes: state.disk_writes.clone(),
            agent_frames: state.agent_frames.clone(),
            exit_status: state.exit_status,
            disk_accesses: self.disk_error.lock().unwrap().1,
            state_checks: state.state_checks,
        }
    }

    /// Puts the replay back at `to`, reading the log from `events` (the
    /// trace's log from its start) on from there. The VM must be restored
    /// from the snapshot taken with `to`.
    pub fn rewind(&self, to: &Checkpoint, mut events: EventStream) -> Result<(), FormatError> {
        for _ in 0..to.position {
            events.next_event()?;
        }
        let mut state = self.state.lock().unwrap();
        state.events = events;
        state.position = to.position;
        state.exits = to.exits;
        state.clock_ns = to.clock_ns;
        state.recent = to.recent.clone();
        state.vcpu = to.vcpu;
        state.disk_writes = to.disk_writes.clone();
        state.agent_frames = to.agent_frames.clone();
        state.exit_status = to.exit_status;
        state.state_checks = to.state_checks;
        state.final_check = None;
        state.divergence = None;
        state.error = None;
        state.pause_at = None;
        state.pause_place = to.position;
        state.last_exit = Instant::now();
        self.disk_error.lock().unwrap().1 = to.disk_accesses;
        Ok(())
    }

    /// The replay goes on after the host held it stopped (a debugger's
    /// stop): that time is not the guest spinning without exits.
    pub fn resumed(&self) {
        self.state.lock().unwrap().last_exit = Instant::now();
    }
}

/// The replayer's side of a snapshot of a replay taken at a pause: where
/// it stands in the log and what it has checked so far. Restoring the VM's
/// snapshot and rewinding to this puts the whole replay back there.
#[derive(Clone)]
pub struct Checkpoint {
    position: u64,
    exits: u64,
    clock_ns: u64,
    recent: VecDeque<(u64, Event)>,
    vcpu: Option<u8>,
    disk_writes: DiskWritesDigest,
    agent_frames: FrameReader,
    exit_status: Option<i32>,
    /// Disk accesses made so far (see `Replayer::disk_error`).
    disk_accesses: u64,
    state_checks: u64,
}

impl Checkpoint {
    pub fn position(&self) -> Position {
        Position {
            events: self.position,
            exits: self.exits,
            guest_ns: self.clock_ns,
        }
    }
}
