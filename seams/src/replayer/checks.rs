//! The checks: what the replay is compared with beyond the log's events
//! (state checks, the recording's outcome), what it has produced so far to
//! compare at its end, and the first divergence. Where a divergence is,
//! the cursor says (`Cursor::divergence_at`).

use provm_trace::event_log::DiskWritesDigest;
use provm_trace::manifest::FinalStateCheck;
use provm_trace::page_digests::{CheckPoint, PageDifference, PageDigests};
use provm_vmm::state_digest::StateDigest;

use super::cursor::Cursor;
use super::{Divergence, Expected, RecordedEnd};
use crate::state_check;

pub(super) struct Checks {
    recorded: RecordedEnd,
    /// The recording's page digests, check by check (`with_page_digests`).
    page_digests: Vec<PageDigests>,
    /// See `Replayer::skip_register_check`.
    registers_unchecked: bool,
    so_far: Tally,
    /// The replayed machine's state, and its memory's piece digests, at its
    /// power-off, once it powered off.
    final_state: Option<(FinalStateCheck, Vec<u16>)>,
    divergence: Option<Divergence>,
}

/// What the replay has produced so far that its end is compared on: what a
/// checkpoint keeps of the checks.
#[derive(Clone, Default)]
pub(super) struct Tally {
    /// The state checks that matched so far.
    state_checks: u64,
    disk_writes: DiskWritesDigest,
    /// The exit status the replayed agent reported, once it has.
    exit_status: Option<i32>,
}

impl Checks {
    /// Checks against the end `recorded` says.
    pub(super) fn new(recorded: RecordedEnd) -> Self {
        Checks {
            recorded,
            page_digests: Vec::new(),
            registers_unchecked: false,
            so_far: Tally::default(),
            final_state: None,
            divergence: None,
        }
    }

    pub(super) fn set_page_digests(&mut self, checks: Vec<PageDigests>) {
        self.page_digests = checks;
    }

    pub(super) fn skip_register_check(&mut self) {
        self.registers_unchecked = true;
    }

    pub(super) fn recorded(&self) -> &RecordedEnd {
        &self.recorded
    }

    pub(super) fn tally(&self) -> Tally {
        self.so_far.clone()
    }

    /// Back at a checkpoint that had produced `tally`: nothing after it was
    /// checked.
    pub(super) fn rewind(&mut self, tally: &Tally) {
        self.so_far = tally.clone();
        self.final_state = None;
        self.divergence = None;
    }

    pub(super) fn divergence(&self) -> Option<&Divergence> {
        self.divergence.as_ref()
    }

    pub(super) fn diverged(&self) -> bool {
        self.divergence.is_some()
    }

    /// Records the divergence. Only the first is reported: callers look
    /// first (`diverged`), since finding one may read the log on.
    pub(super) fn diverge(&mut self, divergence: Divergence) {
        debug_assert!(self.divergence.is_none(), "a second divergence");
        self.divergence = Some(divergence);
    }

    pub(super) fn state_checks(&self) -> u64 {
        self.so_far.state_checks
    }

    pub(super) fn disk_write(&mut self, offset: u64, data: &[u8]) {
        self.so_far.disk_writes.add(offset, data);
    }

    pub(super) fn agent_finished(&mut self, exit_status: i32) {
        self.so_far.exit_status = Some(exit_status);
    }

    /// A state check during the run matched the log.
    pub(super) fn state_check_matched(&mut self) {
        self.so_far.state_checks += 1;
    }

    /// The state check at log event `event` found memory differing, its
    /// pieces' digests `pieces`: the divergence it made names the pages.
    pub(super) fn memory_differs(&mut self, event: u64, pieces: &[u16]) {
        let pages = self.pages_differing(CheckPoint::Event(event), pieces);
        if let Some(divergence) = self.divergence.as_mut() {
            if divergence.event == event && divergence.actual.starts_with("state check") {
                divergence.pages = pages;
            }
        }
    }

    /// The replayed machine's state at its power-off, kept for the check at
    /// the end of the log (`check_outcome`).
    pub(super) fn final_state(&mut self, digest: &StateDigest) {
        // Registers left unchecked need no search for an older trace's
        // TSC rate.
        let recorded = self.recorded.final_check.as_ref();
        let compared = recorded.filter(|_| !self.registers_unchecked);
        let replayed = state_check::replayed(digest, compared);
        self.final_state = Some((replayed, digest.memory.pieces.clone()));
    }

    /// The pages whose digests differ at the check `at` from `replayed`'s,
    /// if the recording kept that check's.
    fn pages_differing(&self, at: CheckPoint, replayed: &[u16]) -> Option<Vec<PageDifference>> {
        let recorded = self.page_digests.iter().find(|check| check.at == at)?;
        Some(recorded.differences(replayed))
    }

    /// At the end of a complete trace's log, where `cursor` stands: the
    /// guest must have powered off, with the recorded exit status, disk
    /// writes and final state.
    pub(super) fn check_outcome(&mut self, cursor: &Cursor, powered_off: bool) {
        let status = |status: Option<i32>| {
            status.map_or("no exit status".to_owned(), |s| format!("exit status {s}"))
        };
        let replayed_disk = self.so_far.disk_writes.hex();
        let (expected, actual) = if !powered_off {
            (
                "the guest's power-off".to_owned(),
                "the replay stopped".to_owned(),
            )
        } else if self.so_far.exit_status != self.recorded.exit_status {
            (
                status(self.recorded.exit_status),
                status(self.so_far.exit_status),
            )
        } else if replayed_disk != self.recorded.disk_writes_sha256 {
            let digest = |sha256: &str| format!("disk writes with SHA-256 {sha256}");
            (
                digest(&self.recorded.disk_writes_sha256),
                digest(&replayed_disk),
            )
        } else if let Some(differs) = self.final_check_difference() {
            (
                "the recorded machine state at the guest's power-off".to_owned(),
                format!(
                    "state check at event {}: {differs}",
                    cursor.position().events
                ),
            )
        } else {
            return;
        };
        let mut divergence = cursor.divergence_at(Expected::Outcome(expected), actual);
        if let (Some(recorded), Some((replayed, pieces))) =
            (&self.recorded.final_check, &self.final_state)
        {
            if recorded.memory != replayed.memory {
                divergence.pages = self.pages_differing(CheckPoint::PowerOff, pieces);
            }
        }
        self.diverge(divergence);
    }

    /// What differs in the replayed machine's final state from the
    /// recorded one, if the recording checked it; counts the check if
    /// nothing does.
    fn final_check_difference(&mut self) -> Option<String> {
        let recorded = self.recorded.final_check.as_ref()?;
        let Some((replayed, _)) = &self.final_state else {
            return Some("the machine state (not taken at the replay's power-off) differs".into());
        };
        let mut replayed = replayed.clone();
        if self.registers_unchecked {
            replayed.registers.clone_from(&recorded.registers);
        }
        let differs = recorded.first_difference(&replayed);
        self.so_far.state_checks += u64::from(differs.is_none());
        differs
    }
}
