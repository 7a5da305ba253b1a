//! Loading runs into a SQLite database, and describing what it holds.

use std::fmt::Write;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::Connection;

use super::tables::{Rows, Table, RUN_COLUMN, TABLES, VIEWS};
use super::{QueryError, Run};

/// A database in memory holding what `sql` asks of `runs` (`provm
/// query`): only the tables it reads are loaded, so that a question about
/// the manifest does not wait for a million events.
pub fn for_query(runs: &[Run], sql: &str) -> Result<Connection, QueryError> {
    let mut db = Connection::open_in_memory()?;
    create(&db)?;
    let needed = tables_read(&mut db, sql)?;
    fill(&mut db, runs, &needed)?;
    Ok(db)
}

/// A database in memory holding `runs`' rows of the tables and views
/// `names` (a view's: the tables it reads), for reading them out (`export
/// parquet`).
pub fn for_tables(runs: &[Run], names: &[&str]) -> Result<Connection, QueryError> {
    let mut db = Connection::open_in_memory()?;
    create(&db)?;
    let mut needed: Vec<&Table> = Vec::new();
    for name in names {
        for table in tables_read(&mut db, &format!("SELECT * FROM {name}"))? {
            if !needed.iter().any(|had| had.name == table.name) {
                needed.push(table);
            }
        }
    }
    fill(&mut db, runs, &needed)?;
    Ok(db)
}

/// Creates every table and view in `db` and loads `runs` into them, the
/// tables filled by replaying the runs only `with_replay`. No index: see
/// `index`.
pub fn load(db: &mut Connection, runs: &[Run], with_replay: bool) -> Result<(), QueryError> {
    create(db)?;
    let tables: Vec<&Table> = TABLES
        .iter()
        .filter(|table| with_replay || !table.from_replay)
        .collect();
    fill(db, runs, &tables)
}

fn create(db: &Connection) -> Result<(), QueryError> {
    for table in TABLES {
        db.execute(&table.create_sql(), ())?;
    }
    for view in VIEWS {
        db.execute(&view.create_sql(), ())?;
    }
    Ok(())
}

/// The tables `sql` reads, views resolved: SQLite's authorizer names each
/// one as the query is prepared against the empty tables. A query that
/// does not prepare gets every table (its error is reported when it runs,
/// and some errors only show with rows).
fn tables_read(db: &mut Connection, sql: &str) -> Result<Vec<&'static Table>, QueryError> {
    let read = Arc::new(Mutex::new(HashSet::new()));
    let seen = read.clone();
    db.authorizer(Some(move |context: AuthContext<'_>| {
        if let AuthAction::Read { table_name, .. } = context.action {
            seen.lock().unwrap().insert(table_name.to_owned());
        }
        Authorization::Allow
    }))?;
    let prepared = db.prepare(sql).is_ok();
    db.authorizer(None::<fn(AuthContext<'_>) -> Authorization>)?;
    let read = read.lock().unwrap();
    Ok(TABLES
        .iter()
        .filter(|table| !prepared || read.contains(table.name))
        .collect())
}

/// Loads `runs` into `tables`, in one transaction with one prepared INSERT
/// per table (a million events load in a few seconds).
fn fill(db: &mut Connection, runs: &[Run], tables: &[&Table]) -> Result<(), QueryError> {
    // Nothing to roll back to: a database being loaded is either in
    // memory or a temporary file that is deleted if loading fails.
    db.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")?;
    let tx = db.transaction()?;
    for run in runs {
        for table in tables {
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
                    "  {:<14} {:<9} {}",
                    column.name,
                    column.kind.name(),
                    column.doc
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
        let mut db = Connection::open_in_memory().unwrap();
        load(&mut db, &[], true).unwrap();
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

    #[test]
    fn a_query_loads_the_tables_it_reads() {
        let read = |sql: &str| -> Vec<&str> {
            let mut db = Connection::open_in_memory().unwrap();
            create(&db).unwrap();
            let tables = tables_read(&mut db, sql).unwrap();
            tables.iter().map(|table| table.name).collect()
        };
        assert_eq!(read("SELECT argv FROM manifest"), ["manifest"]);
        assert_eq!(read("SELECT count(*) FROM exits"), ["events"]);
        assert_eq!(
            read("SELECT * FROM edges JOIN files ON files.id = edges.source"),
            ["files", "edges"]
        );
        assert!(read("SELECT 1").is_empty());
        assert_eq!(read("SELEC oops").len(), TABLES.len());
    }
}
