//! SQL over recorded runs (`provm query`, `provm export sqlite`): the runs'
//! traces are loaded into one SQLite database, table by table (see
//! `tables`), a `run` column telling the runs apart.
//!
//! Why SQLite, through rusqlite with its `bundled` feature (SQLite compiled
//! from source with provm, no system library to match): `export sqlite`
//! must write a real database file that any SQLite client, Python's
//! sqlite3, pandas or DuckDB opens, and SQLite *is* that file format, so one
//! engine serves both commands; the analytical queries people ask of a run
//! (counts, groups, joins over a million event rows) take seconds, and the
//! exported file is indexed for many more; and it costs one C file (its build time
//! and binary size are measured in the README) where DataFusion or DuckDB
//! would add hundreds of crates or a C++ library and minutes of build for a
//! columnar speed that one run's rows do not need.

mod database;
mod output;
mod run;
mod tables;

use std::path::PathBuf;

pub use database::{for_query, for_tables, index, load, schema};
pub use output::{print, OutputFormat};
pub use run::Run;
pub use tables::{Column, Kind, Rows, Table, View, RUN_COLUMN, TABLES, VIEWS};

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Trace(#[from] provm_trace::format::FormatError),
    #[error(transparent)]
    Provenance(#[from] crate::provenance::ProvenanceError),
    #[error("{path}: its timing cannot be read: {reason}")]
    Timing { path: PathBuf, reason: String },
    /// The query itself is wrong: SQLite's message and what can be asked.
    #[error("{message}\n{tables}")]
    Sql { message: String, tables: String },
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot write the result: {0}")]
    Output(#[from] std::io::Error),
    #[error("cannot write the result as CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("{path}: {message}")]
    Export { path: PathBuf, message: String },
    #[error("cannot fill a table by replaying the run: {0}")]
    Replay(String),
}
