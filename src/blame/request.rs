//! `provm blame`: what it shows of one run or two, or of a what-if replay.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use provm_vmm::exit_timing::ExitDelay;

use super::{compare, load, svg, table, BlameError};
use crate::output::{refuse_existing, AtomicFile};

/// How `provm blame` prints one run.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum BlameFormat {
    Text,
    Csv,
    Json,
}

/// What `provm blame` is asked.
pub struct BlameRequest {
    /// One run, or two to compare (traces or `provm run --timing` files).
    pub runs: Vec<PathBuf>,
    pub format: BlameFormat,
    /// Also draw one run as SVG here.
    pub svg: Option<PathBuf>,
    /// Replay the one trace with this change to a device's exits.
    pub what_if: Option<ExitDelay>,
    /// A what-if replay's limit.
    pub timeout: Duration,
    /// Overwrite `svg`.
    pub force: bool,
}

/// Answers `request` on `out` (the SVG goes to its file).
pub fn blame(request: &BlameRequest, out: &mut dyn Write) -> Result<(), BlameError> {
    refuse_existing(request.force, [request.svg.as_deref()])?;
    if let Some(delay) = &request.what_if {
        let [trace] = request.runs.as_slice() else {
            return Err(BlameError::WhatIfOneTrace);
        };
        let predictions = compare::what_if(trace, delay, request.timeout)?;
        compare::write_what_if(delay, &predictions, out)?;
        return Ok(());
    }
    let first = load(&request.runs[0])?;
    if let Some(second) = request.runs.get(1) {
        compare::write_difference(&first, &load(second)?, out)?;
        return Ok(());
    }
    match request.format {
        BlameFormat::Text => table::write_text(&first, out)?,
        BlameFormat::Csv => table::write_csv(&first, out)?,
        BlameFormat::Json => table::write_json(&first, out)?,
    }
    if let Some(path) = &request.svg {
        AtomicFile::write(path, request.force, svg::render(&first).as_bytes())?;
    }
    Ok(())
}
