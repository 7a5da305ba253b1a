//! `provm export ro-crate`: the artifact a paper deposits. A directory
//! holding the trace, a README that says how to check it, and
//! ro-crate-metadata.json describing the run as a Workflow Run RO-Crate
//! (Process Run Crate profile): the command as a CreateAction whose
//! instrument is provm, its inputs and outputs from the run's provenance,
//! its start and end. Several runs make a Provenance Run Crate instead,
//! each run a step of a workflow (workflow.rs). `scripts/check-ro-crate`
//! validates either.

mod metadata;
mod readme;
mod step;
mod workflow;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use provm_trace::reader::Trace;

pub use metadata::License;

use super::ExportError;
use crate::output::AtomicFile;
use crate::provenance::{self, Provenance};
use metadata::{About, Run};
use provm_engine::digest::file_sha256;
use provm_engine::host_paths;
use provm_engine::replay::ReplayOptions;
use step::{CrateFile, Step};

const METADATA: &str = "ro-crate-metadata.json";
const README: &str = "README.md";
const WORKFLOW: &str = "workflow.sh";

/// Writes the RO-Crate of the runs `runs` name (in the order they ran)
/// into `dir` (new or empty, unless `force`), under `license`; each trace
/// is read and verified once (and replayed if its provenance must be
/// derived).
pub fn ro_crate(
    runs: &[ReplayOptions],
    dir: &Path,
    force: bool,
    license: &License,
) -> Result<PathBuf, ExportError> {
    refuse_same_names(runs)?;
    let dir = CrateDir::claim(dir, force)?;
    let mut recorded = Vec::new();
    for run in runs {
        let trace = Trace::open(&run.trace)?;
        let graph = provenance::of_trace(&trace, run, false)?;
        recorded.push(Recorded {
            path: &run.trace,
            trace,
            graph,
        });
    }
    dir.write(&recorded, license)
}

/// The traces are copied into the crate under their file names: two runs
/// may not share one.
fn refuse_same_names(runs: &[ReplayOptions]) -> Result<(), ExportError> {
    let mut names = std::collections::HashSet::new();
    match runs
        .iter()
        .find(|run| !names.insert(host_paths::file_name(&run.trace)))
    {
        Some(again) => Err(ExportError::SameName(again.trace.clone())),
        None => Ok(()),
    }
}

/// A run to put in a crate: where its trace is, the trace read, its
/// provenance.
pub struct Recorded<'a> {
    pub path: &'a Path,
    pub trace: Trace,
    pub graph: Provenance,
}

/// The directory a crate is written into: empty or new, unless forced.
pub struct CrateDir(PathBuf);

impl CrateDir {
    /// Refuses a directory that holds anything (without `force`), or a
    /// path that is not a directory; creates it if it does not exist.
    pub fn claim(dir: &Path, force: bool) -> Result<CrateDir, ExportError> {
        let io_error = |source| ExportError::Io {
            path: dir.to_owned(),
            source,
        };
        match fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_some() && !force {
                    return Err(ExportError::NotEmpty(dir.to_owned()));
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(dir).map_err(io_error)?
            }
            Err(error) => return Err(io_error(error)),
        }
        Ok(CrateDir(dir.to_owned()))
    }

    /// Writes the crate of `runs`: each trace copied, the README, the
    /// metadata (and with several runs the workflow script), each file
    /// whole or not at all. Returns the metadata's path.
    pub fn write(self, runs: &[Recorded], license: &License) -> Result<PathBuf, ExportError> {
        let copies = runs
            .iter()
            .map(|run| self.copy(run.path))
            .collect::<Result<Vec<CrateFile>, ExportError>>()?;
        let steps: Vec<Step> = runs
            .iter()
            .zip(&copies)
            .map(|(run, trace)| Step {
                manifest: &run.trace.manifest,
                outcome: &run.trace.outcome,
                graph: &run.graph,
                trace,
                embeds_image: run.trace.has_image,
            })
            .collect();
        let about = About {
            readme: README,
            license,
            published_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
        };
        let (readme, metadata) = match steps.as_slice() {
            [step] => (
                readme::readme(step),
                metadata::metadata(&Run {
                    step,
                    about: &about,
                }),
            ),
            steps => {
                let script = workflow::script(steps);
                AtomicFile::write(&self.0.join(WORKFLOW), true, script.as_bytes())?;
                (
                    readme::workflow_readme(steps, WORKFLOW),
                    workflow::metadata(steps, WORKFLOW, &about),
                )
            }
        };
        AtomicFile::write(&self.0.join(README), true, readme.as_bytes())?;
        let mut json = serde_json::to_vec_pretty(&metadata).expect("a JSON value serialises");
        json.push(b'\n');
        Ok(AtomicFile::write(&self.0.join(METADATA), true, &json)?)
    }

    /// Copies the trace at `run` into the crate, under its file name.
    fn copy(&self, run: &Path) -> Result<CrateFile, ExportError> {
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |source| ExportError::Io { path, source }
        };
        let name = host_paths::file_name(run);
        // Copied through the open file, not fs::copy: the copy gets a new
        // file's mode, where fs::copy would give it the trace's (0600).
        let mut copy = AtomicFile::create(&self.0.join(&name), true)?;
        fs::File::open(run)
            .and_then(|mut trace| std::io::copy(&mut trace, copy.file()))
            .map_err(io_error(run))?;
        let copied = copy.commit()?;
        Ok(CrateFile {
            size: fs::metadata(&copied).map_err(io_error(&copied))?.len(),
            sha256: file_sha256(&copied).map_err(io_error(&copied))?,
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_holds_anything_is_refused_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new/crate");
        CrateDir::claim(&new, false).unwrap();
        assert!(new.is_dir());
        // Empty: ours to fill.
        CrateDir::claim(&new, false).unwrap();
        fs::write(new.join("notes.txt"), "theirs").unwrap();
        let refused = CrateDir::claim(&new, false).err().unwrap();
        assert!(matches!(refused, ExportError::NotEmpty(_)), "{refused}");
        assert!(refused.to_string().contains("--force"), "{refused}");
        CrateDir::claim(&new, true).unwrap();
        assert!(CrateDir::claim(&new.join("notes.txt"), true).is_err());
    }
}
