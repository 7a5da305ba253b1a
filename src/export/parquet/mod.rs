//! `provm export parquet`: `provm query`'s tables and views as a
//! Hive-partitioned Parquet dataset, `DIR/TABLE/run=ID/part-0.parquet`,
//! that DuckDB, Polars, pandas and Spark read by glob. ID is the trace
//! file's SHA-256, the digest `export ro-crate` names the trace by: unlike
//! a path it does not change when the trace moves, and unlike the event
//! log's digest it tells two pinned recordings of one command apart.
//!
//! The rows come from the same code as `provm query`'s: each run is loaded
//! into an in-memory SQLite database (`query::for_tables`) and each table
//! read out into Arrow record batches (`columns`), so the dataset holds
//! exactly what a query sees, views included.
//!
//! Appendable: a run's partitions are written beside the others'. A run
//! whose partition exists is refused without `--force` (with it, its
//! partitions are replaced, never doubled). A run's files are written under
//! temporary names and renamed into place together at its end, so a run
//! that fails leaves nothing behind.

mod columns;

use std::path::{Path, PathBuf};

use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::ExportError;
use crate::output::AtomicFile;
use crate::query::{self, Column, Run, TABLES, VIEWS};

/// The file in each partition: one per run and table.
const PART: &str = "part-0.parquet";

/// A table or view the dataset holds.
struct Entry {
    name: &'static str,
    columns: &'static [Column],
}

/// A dataset being added to.
pub struct Dataset {
    dir: PathBuf,
    entries: Vec<Entry>,
    force: bool,
}

/// A run added to a dataset.
pub struct Added {
    /// Its partitions' key: the trace's SHA-256.
    pub run: String,
    /// Rows per table, in the order written.
    pub rows: Vec<(&'static str, u64)>,
    /// Whether it replaced partitions already there (`--force`).
    pub replaced: bool,
}

impl Dataset {
    /// The dataset in `dir` (made if absent), to add runs to: the tables
    /// and views named in `only` (every one when empty), the tables filled
    /// by replaying the runs only `with_replay`.
    pub fn open(
        dir: &Path,
        only: &[String],
        with_replay: bool,
        force: bool,
    ) -> Result<Dataset, ExportError> {
        let entries = entries(only, with_replay)?;
        if dir.exists() && !dir.is_dir() {
            return Err(ExportError::NotADirectory(dir.to_owned()));
        }
        std::fs::create_dir_all(dir).map_err(|source| ExportError::Io {
            path: dir.to_owned(),
            source,
        })?;
        Ok(Dataset {
            dir: dir.to_owned(),
            entries,
            force,
        })
    }

    /// Adds the run of `trace`: a partition per table.
    pub fn add(&self, trace: &Path) -> Result<Added, ExportError> {
        check_trace(trace)?;
        let run = provm_engine::digest::file_sha256(trace).map_err(|source| ExportError::Io {
            path: trace.to_owned(),
            source,
        })?;
        let parts: Vec<PathBuf> = self
            .entries
            .iter()
            .map(|entry| {
                self.dir
                    .join(entry.name)
                    .join(format!("run={run}"))
                    .join(PART)
            })
            .collect();
        let replaced = parts.iter().any(|part| part.exists());
        if replaced && !self.force {
            return Err(ExportError::RunExported {
                trace: trace.to_owned(),
                dir: self.dir.clone(),
                run,
            });
        }
        let names: Vec<&str> = self.entries.iter().map(|entry| entry.name).collect();
        let db = query::for_tables(&[Run::open(trace)?], &names)?;
        let mut written = Vec::new();
        let mut rows = Vec::new();
        for (entry, part) in self.entries.iter().zip(&parts) {
            let (file, count) = write_part(&db, entry, part, self.force)?;
            written.push(file);
            rows.push((entry.name, count));
        }
        for file in written {
            file.commit()?;
        }
        Ok(Added {
            run,
            rows,
            replaced,
        })
    }
}

/// Refuses a trace that is not there, naming it.
pub fn check_trace(trace: &Path) -> Result<(), ExportError> {
    match trace.exists() {
        true => Ok(()),
        false => Err(ExportError::NoTrace(trace.to_owned())),
    }
}

/// The tables and views `only` names (every one when empty), in the order
/// they are listed; the tables filled by a replay only `with_replay`.
fn entries(only: &[String], with_replay: bool) -> Result<Vec<Entry>, ExportError> {
    let all: Vec<(Entry, bool)> = TABLES
        .iter()
        .map(|t| (t.name, t.columns, t.from_replay))
        .chain(VIEWS.iter().map(|v| (v.name, v.columns, false)))
        .map(|(name, columns, from_replay)| (Entry { name, columns }, from_replay))
        .collect();
    for name in only {
        match all.iter().find(|(entry, _)| entry.name == name) {
            None => {
                let known: Vec<&str> = all.iter().map(|(entry, _)| entry.name).collect();
                return Err(ExportError::UnknownTable {
                    name: name.clone(),
                    known: known.join(", "),
                });
            }
            Some((_, true)) if !with_replay => {
                return Err(ExportError::NeedsReplay(name.clone()));
            }
            Some(_) => {}
        }
    }
    Ok(all
        .into_iter()
        .filter(|(entry, from_replay)| {
            if only.is_empty() {
                with_replay || !from_replay
            } else {
                only.iter().any(|name| name == entry.name)
            }
        })
        .map(|(entry, _)| entry)
        .collect())
}

/// Writes `entry`'s rows in `db` as a Parquet file at `part`, under a
/// temporary name until it is committed; and how many rows.
fn write_part(
    db: &rusqlite::Connection,
    entry: &Entry,
    part: &Path,
    force: bool,
) -> Result<(AtomicFile, u64), ExportError> {
    let io_error = |source| ExportError::Io {
        path: part.to_owned(),
        source,
    };
    std::fs::create_dir_all(part.parent().expect("a partition's file has a directory"))
        .map_err(io_error)?;
    let mut file = AtomicFile::create(part, force)?;
    let parquet_error = |error: parquet::errors::ParquetError| ExportError::Parquet {
        path: part.to_owned(),
        message: error.to_string(),
    };
    // zstd: the event log's own codec, so the library is built once.
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut writer = ArrowWriter::try_new(
        file.file(),
        columns::schema(entry.columns),
        Some(properties),
    )
    .map_err(parquet_error)?;
    let rows = columns::batches(db, entry.name, entry.columns, |batch| {
        writer.write(&batch).map_err(parquet_error)
    })?;
    writer.close().map_err(parquet_error)?;
    Ok((file, rows))
}
