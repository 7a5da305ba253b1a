//! `provm repro --cpus N --chaos-runs K`: does what the command produces
//! depend on how its threads interleave? It records the command K times,
//! every input pinned and the vCPU schedule drawn from chaos seeds 1 to K
//! (`record --chaos`), groups the seeds by what the runs produced, and keeps
//! one trace per distinct output: a race found is a trace anyone replays.
//!
//! Inputs are pinned so that the schedule is the only difference between
//! runs: a seed then names its run, and the same seed records it again.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provm_engine::record::{self, RecordError, RecordOptions};
use provm_engine::start::RunOptions;

use super::{Observed, ReproError};
use crate::provenance::ProvenanceCapture;

pub struct ChaosOptions {
    /// The command and its machine (more than one vCPU); its `pinned`
    /// inputs, or the defaults, are every run's.
    pub run: RunOptions,
    /// How many seeds to record with: 1 to `runs`.
    pub runs: u64,
    /// The folder the kept traces go to (made; it must not hold files).
    pub traces: PathBuf,
    /// Each recording's `--exitless-limit`.
    pub exitless_limit: Option<Duration>,
}

/// The seeds grouped by what their runs produced, in the order of each
/// group's first seed.
pub struct Schedules {
    pub groups: Vec<Group>,
    /// Seeds whose command did not end: nothing to compare.
    pub failed: Vec<Failed>,
    /// The files written by the first group's runs.
    files: usize,
}

/// The seeds whose runs produced the same.
pub struct Group {
    pub seeds: Vec<u64>,
    /// The kept trace of one of them.
    pub trace: Kept,
    /// What differs from the first group's output (none for the first).
    pub differences: Vec<String>,
    observed: Observed,
    /// `observed`'s digest, which the group's runs share.
    digest: String,
}

/// A trace kept for the user to replay.
pub struct Kept {
    pub seed: u64,
    pub path: PathBuf,
    /// Why the trace is incomplete although the command ended (a power-off
    /// that did not finish), if it is.
    pub cut_short: Option<String>,
}

pub struct Failed {
    pub seed: u64,
    pub error: String,
    pub trace: PathBuf,
}

impl Schedules {
    /// One output from every seed: the schedule did not change the results.
    pub fn reproducible(&self) -> bool {
        self.groups.len() == 1 && self.failed.is_empty()
    }

    fn runs(&self) -> usize {
        let compared: usize = self.groups.iter().map(|group| group.seeds.len()).sum();
        compared + self.failed.len()
    }

    /// Puts seed `seed`'s run in the group of its output (keeping one trace
    /// per group), or among the failed.
    fn add(&mut self, seed: u64, ran: Ran) -> std::io::Result<()> {
        let (observed, kept) = match ran {
            Ran::Failed(failed) => {
                self.failed.push(failed);
                return Ok(());
            }
            Ran::Compared { observed, kept } => (observed, kept),
        };
        let digest = observed.digest();
        let Some(group) = self.groups.iter_mut().find(|group| group.digest == digest) else {
            let differences = self
                .groups
                .first()
                .map_or_else(Vec::new, |first| first.observed.differences(&observed));
            if self.groups.is_empty() {
                self.files = observed.files.len();
            }
            self.groups.push(Group {
                seeds: vec![seed],
                trace: kept,
                differences,
                observed,
                digest,
            });
            return Ok(());
        };
        group.seeds.push(seed);
        // One trace per output is enough; a complete one is better.
        if group.trace.cut_short.is_some() && kept.cut_short.is_none() {
            std::fs::remove_file(&group.trace.path)?;
            group.trace = kept;
        } else {
            std::fs::remove_file(&kept.path)?;
        }
        Ok(())
    }
}

/// How one seed's recording went.
enum Ran {
    Compared { observed: Observed, kept: Kept },
    Failed(Failed),
}

/// Records the command with each seed and groups the seeds; `progress`
/// gets a line per run.
pub fn chaos_runs(
    options: &ChaosOptions,
    progress: &mut dyn Write,
) -> Result<Schedules, ReproError> {
    make_empty_folder(&options.traces)?;
    let mut schedules = Schedules {
        groups: Vec::new(),
        failed: Vec::new(),
        files: 0,
    };
    for seed in 1..=options.runs {
        writeln!(
            progress,
            "provm: repro chaos run {seed} of {}: seed {seed}",
            options.runs
        )
        .map_err(ReproError::Progress)?;
        let ran = record_seed(options, seed)?;
        schedules
            .add(seed, ran)
            .map_err(|source| ReproError::Traces {
                path: options.traces.clone(),
                source,
            })?;
    }
    Ok(schedules)
}

fn make_empty_folder(path: &Path) -> Result<(), ReproError> {
    let error = |source| ReproError::Traces {
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(path).map_err(error)?;
    if std::fs::read_dir(path).map_err(error)?.next().is_some() {
        return Err(ReproError::TracesNotEmpty(path.to_owned()));
    }
    Ok(())
}

/// Records the command with chaos seed `seed`, every input pinned (the
/// clock's step per exit drawn from the seed too).
fn record_seed(options: &ChaosOptions, seed: u64) -> Result<Ran, ReproError> {
    let pinned = options
        .run
        .pinned
        .clone()
        .unwrap_or_default()
        .with_chaos_step(seed);
    let record = RecordOptions {
        run: RunOptions {
            pinned: Some(pinned.clone()),
            keep_overlay: None,
            ..options.run.clone()
        },
        output: options.traces.join(format!("seed-{seed}.provm")),
        embed_image: false,
        exitless_limit: options.exitless_limit,
        chaos: Some(seed),
        preempt: None,
        preempt_computations: false,
    };
    let mut capture = ProvenanceCapture::new(None, Some(pinned), options.run.host_paths);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let recorded = record::record(&record, &mut [&mut capture], &mut stdout, &mut stderr);
    let (outcome, kept) = match recorded {
        Ok(recorded) => (
            recorded.outcome,
            Kept {
                seed,
                path: recorded.trace,
                cut_short: None,
            },
        ),
        Err(RecordError::CutShort {
            error,
            trace,
            command: Some(outcome),
        }) => (
            outcome,
            Kept {
                seed,
                path: trace,
                cut_short: Some(error.to_string()),
            },
        ),
        Err(RecordError::CutShort {
            error,
            trace,
            command: None,
        }) => {
            return Ok(Ran::Failed(Failed {
                seed,
                error: error.to_string(),
                trace,
            }))
        }
        Err(error) => return Err(error.into()),
    };
    let provenance = capture
        .into_document()
        .expect("the job ended, so its provenance was captured");
    Ok(Ran::Compared {
        observed: Observed::new(outcome, stdout, stderr, &provenance),
        kept,
    })
}

impl fmt::Display for Schedules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runs = self.runs();
        let verdict = match self.groups.len() {
            _ if self.reproducible() => "reproducible",
            0 | 1 => "undecided",
            _ => "irreproducible",
        };
        write!(
            f,
            "{verdict}: {runs} chaos schedules (seeds 1 to {runs}) gave "
        )?;
        match self.groups.len() {
            1 => write!(
                f,
                "the same exit status, stdout, stderr and {} files written",
                self.files
            )?,
            outputs => write!(f, "{outputs} different outputs")?,
        }
        if !self.failed.is_empty() {
            write!(f, ", and {} did not finish", self.failed.len())?;
        }
        let first = self.groups.first().map(|group| group.seeds[0]);
        for group in &self.groups {
            write!(f, "\n  {}: {}", seed_list(&group.seeds), group.begins())?;
            if let (false, Some(first)) = (group.differences.is_empty(), first) {
                write!(
                    f,
                    "; against seed {first}: {}",
                    group.differences.join(", ")
                )?;
            }
            write!(f, "; trace {}", group.trace.path.display())?;
            if group.seeds.len() > 1 {
                write!(f, " (seed {}'s)", group.trace.seed)?;
            }
            if let Some(why) = &group.trace.cut_short {
                let why = why.lines().next().unwrap_or_default();
                write!(f, ", incomplete: the power-off did not finish: {why}")?;
            }
        }
        for failed in &self.failed {
            let error = failed.error.lines().next().unwrap_or_default();
            write!(
                f,
                "\n  seed {}: not compared, the command did not end: {error}; trace {} (incomplete)",
                failed.seed,
                failed.trace.display()
            )?;
        }
        // A schedule that changed the output, complete if one is.
        let differing = &self.groups[self.groups.len().min(1)..];
        let replay = differing
            .iter()
            .find(|group| group.trace.cut_short.is_none())
            .or(differing.first());
        if let Some(group) = replay {
            write!(
                f,
                "\nreplay a schedule with: provm replay {}",
                group.trace.path.display()
            )?;
        }
        Ok(())
    }
}

impl Group {
    /// How the group's stdout begins: its first line, shortened.
    fn begins(&self) -> String {
        const SHOWN: usize = 60;
        let stdout = String::from_utf8_lossy(&self.observed.stdout);
        let line = stdout.lines().next().unwrap_or_default();
        match line.char_indices().nth(SHOWN) {
            Some((end, _)) => format!("stdout {:?}...", &line[..end]),
            None => format!("stdout {line:?}"),
        }
    }
}

/// `seed 3` or `seeds 1, 2, 4`.
fn seed_list(seeds: &[u64]) -> String {
    let list: Vec<String> = seeds.iter().map(u64::to_string).collect();
    match seeds.len() {
        1 => format!("seed {}", list[0]),
        _ => format!("seeds {}", list.join(", ")),
    }
}

/// The default folder for the traces: IMAGE's name, `chaos` and the time.
pub fn default_traces(image: &Path) -> PathBuf {
    let trace = record::default_output(image);
    trace.with_extension("chaos")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compared(dir: &Path, seed: u64, stdout: &str, cut_short: Option<&str>) -> Ran {
        let path = dir.join(format!("seed-{seed}.provm"));
        std::fs::write(&path, "").unwrap();
        Ran::Compared {
            observed: Observed {
                exit_status: Some(0),
                stdout: stdout.into(),
                stderr: Vec::new(),
                files: Default::default(),
            },
            kept: Kept {
                seed,
                path,
                cut_short: cut_short.map(Into::into),
            },
        }
    }

    #[test]
    fn seeds_are_grouped_by_output_keeping_one_trace_each_complete_if_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let mut schedules = Schedules {
            groups: Vec::new(),
            failed: Vec::new(),
            files: 0,
        };
        for (seed, stdout, cut_short) in [
            (1, "race 300\n", None),
            (2, "race 561\n", Some("it spun")),
            (3, "race 300\n", None),
            (4, "race 561\n", None),
        ] {
            let ran = compared(dir.path(), seed, stdout, cut_short);
            schedules.add(seed, ran).unwrap();
        }
        assert!(!schedules.reproducible());
        let report = schedules
            .to_string()
            .replace(dir.path().to_str().unwrap(), "DIR");
        assert_eq!(
            report,
            "irreproducible: 4 chaos schedules (seeds 1 to 4) gave 2 different outputs\n  \
             seeds 1, 3: stdout \"race 300\"; trace DIR/seed-1.provm (seed 1's)\n  \
             seeds 2, 4: stdout \"race 561\"; against seed 1: stdout differs; trace DIR/seed-4.provm (seed 4's)\n\
             replay a schedule with: provm replay DIR/seed-4.provm"
        );
        let mut kept: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        kept.sort();
        assert_eq!(kept, ["seed-1.provm", "seed-4.provm"]);
    }
}
