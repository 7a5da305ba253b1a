//! Loading runs into a SQLite database, and describing what it holds.

use std::fmt::Write;

use rusqlite::Connection;

use super::tables::{Rows, RUN_COLUMN, TABLES, VIEWS};
use super::{QueryError, Run};

/// A database in memory holding `runs` (what `provm query` asks).
pub fn in_memory(runs: &[Run]) -> Result<Connection, QueryError> {
    let mut db = Connection::open_in_memory()?;
    load(&mut db, runs)?;
    Ok(db)
}

/// Creates every table and view in `db` and loads `runs` into them, in one
/// transaction with one prepared INSERT per table (a million events load in
/// seconds). No index: see `index`.
pub fn load(db: &mut Connection, runs: &[Run]) -> Result<(), QueryError> {
    // Nothing to roll back to: a database being loaded is either in
    // memory or a temporary file that is deleted if loading fails.
    db.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")?;
    let tx = db.transaction()?;
    for table in TABLES {
        tx.execute(&table.create_sql(), ())?;
    }
    for view in VIEWS {
        tx.execute(&view.create_sql(), ())?;
    }
    for run in runs {
        for table in TABLES {
            let mut rows = Rows::new(&tx, table, &run.name)?;
            (table.fill)(run, &mut rows)?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Indexes the loaded tables: for a database that is kept (`export
/// sqlite`) and queried again and again. A one-off query does without:
/// building an index reads the whole table and sorts it, more than the
/// one scan that query needs.
pub fn index(db: &Connection) -> Result<(), QueryError> {
    for table in TABLES {
        for index in table.index_sql() {
            db.execute(&index, ())?;
        }
    }
    Ok(())
}

/// The tables and views with their columns, one a line: what an error
/// about a query lists. `documented` adds what each is and each column
/// means (`provm query --schema`).
pub fn schema(documented: bool) -> String {
    let mut out = String::new();
    let entries = TABLES
        .iter()
        .map(|t| ("table", t.name, t.doc, t.columns))
        .chain(VIEWS.iter().map(|v| ("view", v.name, v.doc, v.columns)));
    for (what, name, doc, columns) in entries {
        let columns = std::iter::once(&RUN_COLUMN).chain(columns);
        // Writing to a String cannot fail.
        if documented {
            let _ = writeln!(out, "{name} ({what}): {doc}");
            for column in columns {
                let _ = writeln!(
                    out,
                    "  {:<14} {:<8} {}",
                    column.name, column.sql_type, column.doc
                );
            }
        } else {
            let names: Vec<&str> = columns.map(|column| column.name).collect();
            let _ = writeln!(out, "  {name}({})", names.join(", "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_created_and_listed() {
        let db = in_memory(&[]).unwrap();
        for table in TABLES {
            let count: i64 = db
                .query_row(&format!("SELECT count(*) FROM {}", table.name), (), |row| {
                    row.get(0)
                })
                .unwrap();
            assert_eq!(count, 0);
        }
        // The view's documented columns are the ones its SELECT gives.
        for view in VIEWS {
            let statement = db.prepare(&format!("SELECT * FROM {}", view.name)).unwrap();
            let documented: Vec<&str> = std::iter::once(RUN_COLUMN.name)
                .chain(view.columns.iter().map(|column| column.name))
                .collect();
            assert_eq!(statement.column_names().collect::<Vec<_>>(), documented);
        }
        let listed = schema(false);
        assert!(
            listed.contains("  events(run, idx, exit, kind,"),
            "{listed}"
        );
        assert!(schema(true).contains("exits (view): "));
    }
}
