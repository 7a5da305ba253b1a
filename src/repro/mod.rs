//! `provm repro`: is a command reproducible, and if not, why? It runs the
//! command several times with every input class varied, compares what the
//! runs produced (exit status, stdout, stderr, every file written), and
//! when they differ re-runs it with one class pinned at a time to name the
//! class responsible.
//!
//! Every run is a pinned run (see `provm_engine::pinning`): provm fixes all the
//! guest's inputs, so the classes varied here are the only differences
//! between runs, and a class that makes the runs agree when pinned is a
//! cause, not a correlate. Varying host timing (scheduling) is out of
//! reach this way: a pinned run's timing is the guest's own; with more than
//! one vCPU, `--chaos-runs` varies the guest's schedule instead (`chaos`).

mod chaos;
mod observed;
mod verdict;

use std::io::Write;
use std::path::Path;
use std::time::Instant;

pub use chaos::{chaos_runs, default_traces, ChaosOptions, Schedules};
pub use observed::{files_written, Observed, Written};
pub use verdict::{Cause, Verdict};

use provm_engine::machine::Prepared;
use provm_engine::pinning::{Pinning, DEFAULT_EPOCH_NS};
use provm_engine::run;
use provm_engine::start::{self, RunError, RunOptions};

use crate::provenance::ProvenanceCapture;

/// How far apart the varied runs' clocks start: a day, an hour, a minute,
/// a second and a millisecond, so that every field of a date differs.
const CLOCK_OFFSET_NS: u64 = ((86_400 + 3_600 + 60 + 1) * 1_000 + 1) * 1_000_000;

pub struct ReproOptions {
    /// The command and its machine. With `pinned` set, every run gets those
    /// inputs and nothing is varied (a check of provm itself).
    pub run: RunOptions,
    /// How many runs to compare (at least 2).
    pub runs: usize,
}

/// An input class that repro varies, and pins to name a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputClass {
    /// The wall-clock time the guest starts at.
    Clock,
    /// The seed of the guest's entropy.
    Entropy,
}

impl InputClass {
    pub const ALL: [InputClass; 2] = [InputClass::Clock, InputClass::Entropy];

    pub fn name(self) -> &'static str {
        match self {
            InputClass::Clock => "clock",
            InputClass::Entropy => "entropy",
        }
    }

    /// `inputs` with this class taken from `pinned`.
    fn pin(self, inputs: &Pinning, pinned: &Pinning) -> Pinning {
        let mut inputs = inputs.clone();
        match self {
            InputClass::Clock => inputs.epoch_ns = pinned.epoch_ns,
            InputClass::Entropy => inputs.seed = pinned.seed,
        }
        inputs
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReproError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("cannot make a directory for the runs' provenance: {0}")]
    TempDir(std::io::Error),
    #[error("cannot write progress: {0}")]
    Progress(std::io::Error),
    #[error(transparent)]
    Record(#[from] provm_engine::record::RecordError),
    #[error("cannot keep the traces in {path}: {source}")]
    Traces {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the folder for the traces, {0}, holds files already: give another with --traces")]
    TracesNotEmpty(std::path::PathBuf),
}

/// Runs the comparison; `progress` gets a line per run.
pub fn repro(options: &ReproOptions, progress: &mut dyn Write) -> Result<Verdict, ReproError> {
    let mut prepared = start::prepare(&options.run)?;
    let dir = tempfile::tempdir().map_err(ReproError::TempDir)?;
    let mut runner = Runner {
        options,
        prepared: &mut prepared,
        dir: dir.path(),
        done: 0,
        progress,
    };
    let inputs: Vec<Pinning> = (0..options.runs)
        .map(|index| options.run.pinned.clone().unwrap_or_else(|| varied(index)))
        .collect();
    let first = runner.observe(&inputs[0], "")?;
    for other in &inputs[1..] {
        let differences = first.differences(&runner.observe(other, "")?);
        if differences.is_empty() {
            continue;
        }
        let cause = match options.run.pinned {
            Some(_) => Cause::PinnedRepro,
            None => runner.cause(&first, &inputs[0], other)?,
        };
        return Ok(Verdict::Irreproducible { differences, cause });
    }
    Ok(Verdict::Reproducible {
        runs: options.runs,
        varied: options.run.pinned.is_none(),
        files: first.files.len(),
    })
}

/// The inputs of the `index`th varied run: its own clock and seed.
fn varied(index: usize) -> Pinning {
    let mut seed = [0; 32];
    seed[24..].copy_from_slice(&(index as u64 + 1).to_be_bytes());
    Pinning {
        seed,
        epoch_ns: DEFAULT_EPOCH_NS + index as u64 * CLOCK_OFFSET_NS,
        ..Pinning::default()
    }
}

struct Runner<'a> {
    options: &'a ReproOptions,
    prepared: &'a mut Prepared,
    /// Where the runs' provenance goes.
    dir: &'a Path,
    done: usize,
    progress: &'a mut dyn Write,
}

impl Runner<'_> {
    /// Runs the command with `inputs` and returns what it produced.
    fn observe(&mut self, inputs: &Pinning, why: &str) -> Result<Observed, ReproError> {
        self.done += 1;
        writeln!(
            self.progress,
            "provm: repro run {}: clock {}, seed {}{why}",
            self.done,
            provm_engine::utc::date_time(inputs.epoch_ns / 1_000_000_000),
            inputs.seed_hex()
        )
        .map_err(ReproError::Progress)?;
        let options = RunOptions {
            pinned: Some(inputs.clone()),
            keep_overlay: None,
            ..self.options.run.clone()
        };
        let mut capture = ProvenanceCapture::new(
            Some(self.dir.join(format!("run-{}.prov", self.done))),
            options.pinned.clone(),
            options.host_paths,
        );
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + options.timeout;
        let ran = run::run_prepared(
            &options,
            self.prepared,
            deadline,
            &mut [&mut capture],
            (&mut stdout, &mut stderr),
        )?;
        let provenance = capture
            .into_document()
            .expect("the job ended, so its provenance was captured");
        Ok(Observed::new(ran.outcome, stdout, stderr, &provenance))
    }

    /// Why runs with inputs `first` and `other` differ: re-runs with each
    /// class pinned to `first`'s value and the rest as in `other`.
    fn cause(
        &mut self,
        baseline: &Observed,
        first: &Pinning,
        other: &Pinning,
    ) -> Result<Cause, ReproError> {
        let mut stable = Vec::new();
        let mut not = Vec::new();
        for class in InputClass::ALL {
            let why = format!(" ({} pinned)", class.name());
            let pinned = self.observe(&class.pin(other, first), &why)?;
            if baseline.differences(&pinned).is_empty() {
                stable.push(class);
            } else {
                not.push(class);
            }
        }
        if !stable.is_empty() {
            return Ok(Cause::Pinned { stable, not });
        }
        let again = self.observe(first, " (every input pinned)")?;
        Ok(if baseline.differences(&again).is_empty() {
            Cause::Each
        } else {
            Cause::Provm
        })
    }
}
