//! One recorded run as the tables see it: its verified trace and, when it
//! was recorded with `--prov`, its provenance graph; its exit timing on
//! demand.

use std::path::Path;

use provm_trace::reader::Trace;

use super::QueryError;
use crate::provenance::Provenance;
use provm_engine::timing::TimingReport;

pub struct Run {
    /// What the `run` column holds: the trace's path as given.
    pub name: String,
    pub trace: Trace,
    pub provenance: Option<Provenance>,
}

impl Run {
    /// Opens and verifies the trace at `path`.
    pub fn open(path: &Path) -> Result<Run, QueryError> {
        let trace = Trace::open(path)?;
        let provenance = trace
            .provenance
            .as_deref()
            .map(|bytes| Provenance::from_bytes(bytes, path))
            .transpose()?;
        Ok(Run {
            name: path.display().to_string(),
            trace,
            provenance,
        })
    }

    /// The vCPU the event log runs on until its first switch: the one the
    /// recording's snapshot was taken on, not always vCPU 0.
    pub fn first_vcpu(&self) -> Result<u8, QueryError> {
        let machine = self.trace.manifest.machine_version;
        let state =
            provm_engine::snapshot::state(&self.trace.snapshot, machine).map_err(|error| {
                QueryError::Export {
                    path: self.trace.path.clone(),
                    message: format!("its snapshot cannot be read: {error}"),
                }
            })?;
        Ok(state.running_vcpu() as u8)
    }

    /// The trace's exit timing, if it has a timing section (not with
    /// `--no-timing`, nor from an older provm). Read when asked, not at
    /// open: a query that does not read it must not fail on it.
    pub fn timing(&self) -> Result<Option<TimingReport>, QueryError> {
        let Some(bytes) = &self.trace.timing else {
            return Ok(None);
        };
        let report = TimingReport::from_json(bytes).map_err(|reason| QueryError::Timing {
            path: self.trace.path.clone(),
            reason,
        })?;
        Ok(Some(report))
    }
}
