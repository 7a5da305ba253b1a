//! Pausing a replay at a log event and putting it back at a checkpoint:
//! with the VM's snapshot taken there, time travel (gdb's reverse
//! execution, forks).

use provm_trace::event_log::EventStream;
use provm_trace::format::FormatError;

use super::agent::AgentFrames;
use super::checks::Tally;
use super::cursor::{Cursor, Mark};
use super::{Position, Replayer};

impl Replayer {
    /// Pauses the replay at the first VM exit at or after log event
    /// `event` (`None`: no pause).
    pub fn pause_at(&self, event: Option<u64>) {
        self.state.lock().unwrap().cursor.pause_at(event);
    }

    /// The log position of the last place the replay could pause: right
    /// after the last VM exit (or where `rewind` put it). Between two exits
    /// the guest runs without touching the log, so this names the stretch
    /// a debug stop is in, and `pause_at` with it stops at that stretch's
    /// start.
    pub fn pause_place(&self) -> u64 {
        self.state.lock().unwrap().cursor.pause_place()
    }

    /// Where the replay stands, to come back to with `rewind`. Take it at a
    /// pause, with the VM's snapshot.
    pub fn checkpoint(&self) -> Checkpoint {
        let state = self.state.lock().unwrap();
        Checkpoint {
            cursor: state.cursor.mark(),
            checks: state.checks.tally(),
            agent: state.agent.clone(),
            disk_accesses: self.disk_error.lock().unwrap().1,
        }
    }

    /// Puts the replay back at `to`, reading the log from `events` (the
    /// trace's log from its start) on from there. The VM must be restored
    /// from the snapshot taken with `to`.
    pub fn rewind(&self, to: &Checkpoint, events: EventStream) -> Result<(), FormatError> {
        // Outside the lock: a log that cannot be read that far leaves the
        // replay as it was.
        let cursor = Cursor::rewound(&to.cursor, events)?;
        let mut state = self.state.lock().unwrap();
        state.cursor = cursor;
        state.checks.rewind(&to.checks);
        state.agent = to.agent.clone();
        self.disk_error.lock().unwrap().1 = to.disk_accesses;
        Ok(())
    }

    /// The replay goes on after the host held it stopped (a debugger's
    /// stop): that time is not the guest spinning without exits.
    pub fn resumed(&self) {
        self.state.lock().unwrap().cursor.restart_exitless();
    }
}

/// The replayer's side of a snapshot of a replay taken at a pause: where
/// it stands in the log and what it has checked so far. Restoring the VM's
/// snapshot and rewinding to this puts the whole replay back there.
#[derive(Clone)]
pub struct Checkpoint {
    cursor: Mark,
    checks: Tally,
    agent: AgentFrames,
    /// Disk accesses made so far (see `Replayer::disk_error`).
    disk_accesses: u64,
}

impl Checkpoint {
    pub fn position(&self) -> Position {
        self.cursor.position()
    }
}
