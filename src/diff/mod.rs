//! `provm diff A B`: where two recorded runs of a command parted and what
//! came out differently, from their traces alone (no replay). In the order
//! a reader asks: were they asked the same (the manifests, `setup`), the
//! first input where their logs part (`walk`), and the outputs that differ
//! (exit status, stdout, stderr, the files copied back or written, the
//! disk writes), compared as `provm repro` compares its runs.

mod setup;
mod walk;

use std::fmt;
use std::path::{Path, PathBuf};

use provm_trace::format::FormatError;
use provm_trace::reader::Trace;

use crate::agent_outputs::Quoted;
use crate::provenance::{Provenance, ProvenanceError};
use crate::repro::{files_written, Observed, Written};

pub use setup::Difference;
pub use walk::{Parting, Source};

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{path}: {source}; {fix}")]
    Trace {
        path: PathBuf,
        source: FormatError,
        fix: &'static str,
    },
    #[error(transparent)]
    Provenance(#[from] ProvenanceError),
}

impl DiffError {
    fn trace(path: &Path, source: FormatError) -> DiffError {
        let fix = match source {
            FormatError::Open { .. } => "give the trace (.provm) that `provm record -o` wrote",
            FormatError::NotATrace(_) => "give a trace (.provm) that `provm record -o` wrote",
            // Their words say which provm reads them.
            FormatError::NewerFormat { .. } | FormatError::RetiredFormat { .. } => {
                "compare it with that provm"
            }
            _ => "the trace is damaged: copy it again from where it was recorded, or record the run again (`provm inspect` verifies a trace)",
        };
        DiffError::Trace {
            path: path.to_owned(),
            source,
            fix,
        }
    }
}

/// How two runs compare.
pub struct Diff {
    /// The runs, as given.
    pub runs: [RunSummary; 2],
    /// What they were asked differently, first the command.
    pub setup: Vec<Difference>,
    /// Where their logs part; `None`: the same events.
    pub parting: Option<Parting>,
    /// What came out differently, in words.
    pub outputs: Vec<String>,
    /// Each run's stdout and stderr, shown where they differ.
    streams: [[Vec<u8>; 2]; 2],
}

pub struct RunSummary {
    pub path: PathBuf,
    pub events: u64,
    pub exit_status: Option<i32>,
    /// Why the recording ended, when it was cut short.
    pub cut_short: Option<String>,
}

/// Compares the runs `first` and `second`, verifying both traces.
pub fn diff(first: &Path, second: &Path) -> Result<Diff, DiffError> {
    let open = |path: &Path| Trace::open(path).map_err(|error| DiffError::trace(path, error));
    let traces = [open(first)?, open(second)?];
    let walked = walk::walk([&traces[0], &traces[1]])
        .map_err(|(side, error)| DiffError::trace(&traces[side].path, error))?;
    // Files from provenance only when both kept theirs: else every file
    // would be "written in one run only".
    let provenance = traces.iter().all(|trace| trace.provenance.is_some());
    let observed = [
        observed(&traces[0], &walked.runs[0], provenance)?,
        observed(&traces[1], &walked.runs[1], provenance)?,
    ];
    let mut outputs = observed[0].differences(&observed[1]);
    let writes = |trace: &Trace| {
        let outcome = &trace.outcome;
        let digest = &outcome.disk_writes_sha256;
        format!(
            "{} writes, sha256 {}...",
            outcome.disk_writes,
            &digest[..16.min(digest.len())]
        )
    };
    if traces[0].outcome.disk_writes_sha256 != traces[1].outcome.disk_writes_sha256 {
        outputs.push(format!(
            "the disk writes differ ({} against {})",
            writes(&traces[0]),
            writes(&traces[1])
        ));
    }
    let summary = |trace: &Trace, log: &walk::RunLog, observed: &Observed| RunSummary {
        path: trace.path.clone(),
        events: log.events,
        exit_status: observed.exit_status,
        cut_short: (!trace.outcome.complete).then(|| trace.outcome.ended.clone()),
    };
    Ok(Diff {
        runs: [
            summary(&traces[0], &walked.runs[0], &observed[0]),
            summary(&traces[1], &walked.runs[1], &observed[1]),
        ],
        setup: setup::differences(&traces[0].manifest, &traces[1].manifest),
        parting: walked.parting,
        outputs,
        streams: observed.map(|run| [run.stdout, run.stderr]),
    })
}

/// What a run produced, as `provm repro` compares it: the files are those
/// it copied back (--output), by digest, and with `provenance` those its
/// provenance (recorded with --prov) says it left written.
fn observed(trace: &Trace, log: &walk::RunLog, provenance: bool) -> Result<Observed, DiffError> {
    let mut files = match &trace.provenance {
        Some(embedded) if provenance => {
            files_written(&Provenance::from_bytes(embedded, &trace.path)?)
        }
        _ => Default::default(),
    };
    let roots = log.job.as_ref().map_or(&[][..], |job| &job.outputs[..]);
    for ((tree, under), sha256) in log.outputs.file_digests() {
        let root = roots.get(tree as usize).map_or_else(
            || format!("output {tree}"),
            |root| String::from_utf8_lossy(root).into_owned(),
        );
        files.entry(walk::joined(&root, &under)).or_insert(Written {
            sha256: Some(sha256),
            writer: "the command, copied back by --output".into(),
        });
    }
    Ok(Observed {
        exit_status: log.outputs.finished.map(|outcome| outcome.shell_status()),
        stdout: log.outputs.stdout.clone(),
        stderr: log.outputs.stderr.clone(),
        files,
    })
}

impl Diff {
    /// The same command on the same machine, the same events, the same
    /// outputs.
    pub fn is_same(&self) -> bool {
        self.setup.is_empty() && self.parting.is_none() && self.outputs.is_empty()
    }

    /// The comparison as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let runs: Vec<_> = self
            .runs
            .iter()
            .map(|run| {
                json!({
                    "trace": run.path,
                    "events": run.events,
                    "exit_status": run.exit_status,
                    "cut_short": run.cut_short,
                })
            })
            .collect();
        let setup: Vec<_> = self
            .setup
            .iter()
            .map(|d| json!({ "what": d.what, "first": d.first, "second": d.second }))
            .collect();
        let parting = self.parting.as_ref().map(|parting| {
            json!({
                "event": parting.index,
                "kind": parting.source.name(),
                "device": parting.device,
                "first": parting.value(0),
                "second": parting.value(1),
                "words": parting.source.to_string(),
            })
        });
        json!({
            "same": self.is_same(),
            "runs": runs,
            "setup": setup,
            "parting": parting,
            "outputs": self.outputs,
        })
    }
}

/// The comparison as `provm diff` prints it.
impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = ["first", "second"];
        for (name, run) in names.iter().zip(&self.runs) {
            let status = run.exit_status.map_or("did not finish".into(), |status| {
                format!("exit status {status}")
            });
            let cut = run
                .cut_short
                .as_ref()
                .map_or(String::new(), |ended| format!(" (cut short: {ended})"));
            writeln!(
                f,
                "{name:<10} {}: {} events, {status}{cut}",
                run.path.display(),
                run.events
            )?;
        }
        writeln!(f, "{:<10} both traces, every section's SHA-256", "verified")?;
        if self.setup.is_empty() {
            writeln!(f, "setup      the same command, image, kernel and machine")?;
        } else {
            writeln!(
                f,
                "setup      differs: the runs were asked different things"
            )?;
            for difference in &self.setup {
                writeln!(f, "  {:<20} {}", difference.what, difference.first)?;
                writeln!(f, "  {:<20} {}", "", difference.second)?;
            }
        }
        match &self.parting {
            None => writeln!(f, "inputs     the same: the logs hold the same events")?,
            Some(parting) => {
                writeln!(
                    f,
                    "inputs     the logs part at event {}: {}",
                    parting.index, parting.source
                )?;
                if let Some(device) = parting.device {
                    writeln!(f, "  device   {device}")?;
                }
                for (side, name) in names.iter().enumerate() {
                    writeln!(f, "  {name:<8} {}", parting.value(side))?;
                }
            }
        }
        if self.outputs.is_empty() {
            writeln!(
                f,
                "outputs    the same: exit status, stdout, stderr, files and disk writes"
            )?;
        } else {
            writeln!(f, "outputs    differ:")?;
            for difference in &self.outputs {
                writeln!(f, "  {difference}")?;
            }
            for (stream, name) in ["stdout", "stderr"].iter().enumerate() {
                let [first, second] = [&self.streams[0][stream], &self.streams[1][stream]];
                if first != second {
                    write!(f, "{name} of the first:\n{}", Quoted(first))?;
                    write!(f, "{name} of the second:\n{}", Quoted(second))?;
                }
            }
        }
        writeln!(f, "verdict    {}", self.verdict())
    }
}

impl Diff {
    /// The comparison in one line.
    fn verdict(&self) -> String {
        if self.is_same() {
            return format!(
                "the same run: the same command, the same {} events, the same outputs",
                self.runs[0].events
            );
        }
        let mut found = Vec::new();
        if !self.setup.is_empty() {
            let whats: Vec<&str> = self.setup.iter().map(|d| d.what).collect();
            found.push(format!("asked differently ({})", whats.join(", ")));
        }
        if let Some(parting) = &self.parting {
            found.push(format!(
                "parted at event {} ({})",
                parting.index,
                parting.source.name()
            ));
        }
        found.extend(self.outputs.iter().cloned());
        format!("different runs: {}", found.join("; "))
    }
}
