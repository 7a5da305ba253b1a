//! Hypervisor blame: how much of each guest process's time the
//! virtualization layer cost. The engine times every exit and attributes
//! it to the guest process running at it (`provm_engine::timing`);
//! `provm blame` shows it (`table`, `svg`), compares two runs and replays a
//! run under a changed exit cost (`compare`).

pub mod compare;
pub mod inject;
mod request;
pub mod svg;
pub mod table;

use std::path::{Path, PathBuf};

use provm_engine::timing::{TimingObserver, TimingReport};
use provm_trace::format::FormatError;
use provm_trace::reader::Trace;
use provm_vmm::exit_timing::ExitDelay;

use crate::output::{AtomicFile, OutputError};

pub use request::{blame, BlameFormat, BlameRequest};

#[derive(Debug, thiserror::Error)]
pub enum BlameError {
    #[error("{0}")]
    Trace(#[from] FormatError),
    #[error("{0} has no timing: it was recorded by an older provm or with --no-timing; record it again, or run with `provm run --timing FILE`")]
    NoTiming(PathBuf),
    #[error("{path}: its timing cannot be read: {reason}")]
    BadTiming { path: PathBuf, reason: String },
    #[error("{0} is neither a trace nor a timing file (`provm run --timing`)")]
    NotARun(PathBuf),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("cannot replay for --what-if: {0}")]
    Replay(#[from] provm_engine::replay::ReplayError),
    #[error("cannot write blame's output: {0}")]
    Write(#[from] std::io::Error),
    #[error("cannot write blame's CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("--what-if replays one trace")]
    WhatIfOneTrace,
    #[error("cannot replay for --what-if: {0}")]
    Diverged(String),
}

/// Whether and how to capture exit timing in a run, a recording or a replay.
#[derive(Clone, Debug, Default)]
pub struct TimingOptions {
    /// Capture it (a recording does by default; a run with `--timing`).
    pub capture: bool,
    /// Write it here as JSON (`provm run --timing FILE`).
    pub output: Option<PathBuf>,
    /// Wait longer after each exit of a device (`--inject-exit-delay`).
    pub delay: Option<ExitDelay>,
}

impl TimingOptions {
    /// Whether timing is captured (else only the delay is injected).
    pub fn captures(&self) -> bool {
        self.capture || self.output.is_some()
    }

    /// The observer that captures a run's timing as these options ask
    /// (`mode`, the run's kind, is said in the report), and injects the
    /// delay either way.
    pub fn observer(&self, mode: &str) -> TimingObserver {
        TimingObserver::new(mode, self.captures(), self.delay.clone())
    }

    /// Writes what `observer` captured where `--timing FILE` asked, if it
    /// did.
    pub fn save_requested(&self, observer: &TimingObserver) -> Result<(), BlameError> {
        match (observer.report(), &self.output) {
            (Some(report), Some(path)) => save(&report, path),
            _ => Ok(()),
        }
    }
}

/// Writes `report` to `path` as JSON (the caller has refused an existing
/// file already, unless forced).
pub fn save(report: &TimingReport, path: &Path) -> Result<(), BlameError> {
    AtomicFile::write(path, true, &report.to_json())?;
    Ok(())
}

/// The timing of RUN: a trace's timing section, or a `--timing` file.
pub fn load(path: &Path) -> Result<TimingReport, BlameError> {
    let bad = |reason: String| BlameError::BadTiming {
        path: path.to_owned(),
        reason,
    };
    let bytes = if provm_trace::format::starts_as_trace(path) {
        Trace::open(path)?
            .timing
            .ok_or_else(|| BlameError::NoTiming(path.to_owned()))?
    } else {
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        if serde_json::from_slice::<serde_json::Value>(&bytes).is_err() {
            return Err(BlameError::NotARun(path.to_owned()));
        }
        bytes
    };
    TimingReport::from_json(&bytes).map_err(bad)
}
