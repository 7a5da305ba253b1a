//! `provm export sqlite`: `provm query`'s tables in a database file.

use std::path::Path;

use rusqlite::Connection;

use super::ExportError;
use crate::output::AtomicFile;
use crate::query::{self, Run};

/// Writes `runs` into a new SQLite database at `path`; the tables filled
/// by replaying the runs only `with_replay`.
pub fn sqlite(
    runs: &[Run],
    path: &Path,
    force: bool,
    with_replay: bool,
) -> Result<(), ExportError> {
    let file = AtomicFile::create(path, force)?;
    // SQLite takes the empty temporary file as a new database.
    let mut db = Connection::open(file.temp_path()).map_err(query::QueryError::from)?;
    query::load(&mut db, runs, with_replay)?;
    query::index(&db)?;
    db.close()
        .map_err(|(_, error)| query::QueryError::from(error))?;
    file.commit()?;
    Ok(())
}
