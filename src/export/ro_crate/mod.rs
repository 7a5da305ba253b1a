//! `provm export ro-crate`: the artifact a paper deposits. A directory
//! holding the trace, a README that says how to check it, and
//! ro-crate-metadata.json describing the run as a Workflow Run RO-Crate
//! (Process Run Crate profile): the command as a CreateAction whose
//! instrument is provm, its inputs and outputs from the run's provenance,
//! its start and end. `scripts/check-ro-crate` validates it.

mod metadata;
mod readme;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use provm_trace::reader::Trace;

pub use metadata::License;

use super::ExportError;
use crate::output::AtomicFile;
use crate::provenance::{self, Provenance};
use metadata::{CrateFile, Run};
use provm_engine::digest::file_sha256;
use provm_engine::host_paths;
use provm_engine::replay::ReplayOptions;

const METADATA: &str = "ro-crate-metadata.json";
const README: &str = "README.md";

/// Writes the RO-Crate of the run `run` names into `dir` (new or empty,
/// unless `force`), under `license`; the trace is read and verified once
/// (and replayed if its provenance must be derived).
pub fn ro_crate(
    run: &ReplayOptions,
    dir: &Path,
    force: bool,
    license: &License,
) -> Result<PathBuf, ExportError> {
    let dir = CrateDir::claim(dir, force)?;
    let trace = Trace::open(&run.trace)?;
    let graph = provenance::of_trace(&trace, run, false)?;
    dir.write(&run.trace, &trace, &graph, license)
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

    /// Writes the crate of the run `trace` (read from `run`) whose
    /// provenance is `graph`: the trace copied, the README, the metadata,
    /// each file whole or not at all. Returns the metadata's path.
    pub fn write(
        self,
        run: &Path,
        trace: &Trace,
        graph: &Provenance,
        license: &License,
    ) -> Result<PathBuf, ExportError> {
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
        let trace_file = CrateFile {
            size: fs::metadata(&copied).map_err(io_error(&copied))?.len(),
            sha256: file_sha256(&copied).map_err(io_error(&copied))?,
            name,
        };
        let readme = readme::readme(&trace.manifest, &trace_file, trace.has_image);
        AtomicFile::write(&self.0.join(README), true, readme.as_bytes())?;
        let published_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let metadata = metadata::metadata(&Run {
            manifest: &trace.manifest,
            outcome: &trace.outcome,
            graph,
            trace: &trace_file,
            readme: README,
            license,
            published_unix,
        });
        let mut json = serde_json::to_vec_pretty(&metadata).expect("a JSON value serialises");
        json.push(b'\n');
        Ok(AtomicFile::write(&self.0.join(METADATA), true, &json)?)
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
