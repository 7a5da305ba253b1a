//! `provm run`: start the guest on a copy-on-write view of an image (from
//! the cached snapshot of its booted state when there is one), run one
//! command, and report how it ended. The start is `crate::start`'s, with
//! nothing logged; a run adds the outputs delivered and, when pinned, its
//! log's digest.

use std::io::Write;
use std::time::Instant;

use provm_guest_agent::Outcome;

use crate::machine::Prepared;
use crate::observer::Observer;
use crate::start::{self, Booted, Logging, RunError, RunOptions};
use crate::transfer;

/// How a run went.
pub struct Ran {
    pub outcome: Outcome,
    /// A pinned run's event log digest (see `LogTotals::events_sha256`).
    pub events_sha256: Option<String>,
}

/// Starts the guest, runs the command with its output streamed to `stdout`
/// and `stderr`, watched by `observers`, powers the guest off and returns
/// how the command ended.
pub fn run(
    options: &RunOptions,
    observers: &mut [&mut dyn Observer],
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<Ran, RunError> {
    let deadline = Instant::now() + options.timeout;
    let mut prepared = start::prepare(options)?;
    run_prepared(
        options,
        &mut prepared,
        deadline,
        observers,
        (stdout, stderr),
    )
}

/// `run`, on an image checked already.
pub fn run_prepared(
    options: &RunOptions,
    prepared: &mut Prepared,
    deadline: Instant,
    observers: &mut [&mut dyn Observer],
    streams: (&mut dyn Write, &mut dyn Write),
) -> Result<Ran, RunError> {
    let (job, mut data) = start::job_with_data(options, prepared)?;
    let booted = Booted::of(prepared, deadline)?;
    let started = start::start(
        options,
        prepared,
        booted.snapshot,
        deadline,
        Logging::Off,
        observers,
    )?;
    let ended = started.run_job(job, &mut data, prepared, observers, streams);
    let outcome = ended.outcome?;
    transfer::deliver(data.outputs)?;
    // Without a trace the log writes nothing, so it cannot fail.
    let events_sha256 = ended.recorder.map(|recorder| {
        let (_, totals) = recorder.finish().expect("a digest-only log has no writes");
        totals.events_sha256
    });
    Ok(Ran {
        outcome,
        events_sha256,
    })
}
