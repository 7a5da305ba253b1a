//! `provm export`: a recorded run written out for the tools researchers
//! already use, and as the RO-Crate a paper deposits. Every output is
//! written through `output::AtomicFile`.

mod files;
mod makefile;
mod oci;
pub mod parquet;
pub mod ro_crate;
mod sqlite;
mod timeline;

use std::path::PathBuf;

use crate::output::OutputError;

pub use files::files;
pub use makefile::makefile;
pub use oci::{oci_archive, TAG as OCI_TAG};
pub use sqlite::sqlite;
pub use timeline::timeline;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("{0} is not empty; pass --force to write into it anyway, or choose a new or empty directory")]
    NotEmpty(PathBuf),
    #[error(transparent)]
    Query(#[from] crate::query::QueryError),
    #[error(transparent)]
    Trace(#[from] provm_trace::format::FormatError),
    #[error("export files: {0}")]
    Files(String),
    #[error("export oci: {0}")]
    Oci(String),
    #[error("{0}: another run of the crate has its file name, which the crate keeps it under; copy one under another name")]
    SameName(PathBuf),
    #[error("{0}: no such trace; name the .provm files that provm record wrote")]
    NoTrace(PathBuf),
    #[error(
        "{0} is a file, and a Parquet dataset is a directory; name a new or existing directory"
    )]
    NotADirectory(PathBuf),
    #[error("{trace} is in {dir} already (run={run}); pass --force to replace its partitions")]
    RunExported {
        trace: PathBuf,
        dir: PathBuf,
        run: String,
    },
    #[error("no table or view {name}; the tables and views: {known}")]
    UnknownTable { name: String, known: String },
    #[error("{0} is filled by replaying each run: add --with-replay")]
    NeedsReplay(String),
    #[error("{path}: Parquet: {message}")]
    Parquet { path: PathBuf, message: String },
    #[error("cannot replay the run for the export: {0}")]
    Replay(String),
    #[error(transparent)]
    Provenance(#[from] crate::provenance::ProvenanceError),
    #[error(transparent)]
    Image(#[from] provm_engine::replay::ReplayError),
    #[error(transparent)]
    Chain(#[from] provm_engine::disk::chain::ChainError),
}
