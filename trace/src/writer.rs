//! Writing a whole trace, the mirror of `reader::Trace::open`: the leading
//! sections (what was run and what it starts from), the event log, then the
//! outcome and the sections after it, in the order readers expect. A
//! recording and a fork both write through it, so a trace has one shape.

use std::path::{Path, PathBuf};

use crate::event_log::LogTotals;
use crate::format::{FormatError, SectionKind, SectionWriter, TraceReader};
use crate::manifest::{Manifest, Outcome};

/// What a trace holds before its event log.
pub struct Leading {
    pub manifest: Manifest,
    /// zstd-compressed.
    pub kernel: Vec<u8>,
    pub kernel_profile: Vec<u8>,
    /// zstd-compressed.
    pub initramfs: Vec<u8>,
    /// The booted guest's snapshot the log starts from (`snapshot` codec).
    pub snapshot: Vec<u8>,
}

impl Leading {
    /// The leading sections of the trace at `path`, as they are, under a
    /// new `manifest` (a fork's: it starts where its recording started).
    pub fn of_trace(path: &Path, manifest: Manifest) -> Result<Self, FormatError> {
        let mut leading = Leading {
            manifest,
            kernel: Vec::new(),
            kernel_profile: Vec::new(),
            initramfs: Vec::new(),
            snapshot: Vec::new(),
        };
        let mut reader = TraceReader::open(path)?;
        while let Some(header) = reader.next_header()? {
            let slot = match header.kind {
                SectionKind::Kernel => &mut leading.kernel,
                SectionKind::KernelProfile => &mut leading.kernel_profile,
                SectionKind::Initramfs => &mut leading.initramfs,
                SectionKind::Snapshot => &mut leading.snapshot,
                // The log starts after these.
                SectionKind::Events => break,
                // Skipped (and verified) by the next header's read.
                _ => continue,
            };
            *slot = reader.read_payload(header)?.payload;
        }
        Ok(leading)
    }
}

/// A trace being written, with its leading sections.
pub struct TraceWriter {
    sections: SectionWriter,
}

impl TraceWriter {
    /// Starts the trace at `path` (which appears only when finished).
    pub fn create(path: &Path, leading: &Leading) -> Result<Self, FormatError> {
        let mut sections = SectionWriter::create(path)?;
        let manifest = serde_json::to_vec_pretty(&leading.manifest).expect("serialises");
        for (kind, payload) in [
            (SectionKind::Manifest, &manifest),
            (SectionKind::Kernel, &leading.kernel),
            (SectionKind::KernelProfile, &leading.kernel_profile),
            (SectionKind::Initramfs, &leading.initramfs),
            (SectionKind::Snapshot, &leading.snapshot),
        ] {
            sections.section(kind, payload)?;
        }
        Ok(TraceWriter { sections })
    }

    /// Where the event log goes on (an `EventLogWriter`, which gives it back
    /// when finished, for `finish`).
    pub fn into_sections(self) -> SectionWriter {
        self.sections
    }

    /// Ends the trace whose log `sections` holds: `outcome`, naming the
    /// sections `after` it, then those; renames the trace into place.
    pub fn finish(
        mut sections: SectionWriter,
        mut outcome: Outcome,
        after: &[(SectionKind, Vec<u8>)],
    ) -> Result<PathBuf, FormatError> {
        outcome.sections_after = Some(after.iter().map(|(kind, _)| kind.name().into()).collect());
        sections.section(
            SectionKind::Outcome,
            &serde_json::to_vec_pretty(&outcome).expect("serialises"),
        )?;
        for (kind, payload) in after {
            sections.section(*kind, payload)?;
        }
        sections.finish()
    }
}

/// How a run ended, in the words its outcome keeps.
pub struct Ending {
    /// False when the run was cut short.
    pub complete: bool,
    pub ended: String,
    pub exit_status: Option<i32>,
}

impl Outcome {
    /// The outcome of a run that `ending`, whose log `totals` describes from
    /// the guest time `start_ns` on, in `host_seconds`; what only a
    /// recording or a fork knows is left for it to add.
    pub fn of_log(
        ending: Ending,
        totals: &LogTotals,
        start_ns: u64,
        host_seconds: f64,
        console_tail: String,
    ) -> Self {
        Outcome {
            complete: ending.complete,
            ended: ending.ended,
            exit_status: ending.exit_status,
            events: totals.events,
            exits: totals.exits,
            event_chunks: totals.chunks,
            guest_ns: totals.last_clock_ns.saturating_sub(start_ns),
            disk_writes: totals.disk_writes,
            disk_writes_sha256: totals.disk_writes_sha256.clone(),
            host_seconds,
            longest_exitless_seconds: None,
            console_tail,
            // Set by `TraceWriter::finish`, which writes them.
            sections_after: None,
            events_sha256: Some(totals.events_sha256.clone()),
            fork_event: None,
            disk_error_access: None,
            state_check: None,
        }
    }
}
