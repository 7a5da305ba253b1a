//! The tables a run is loaded into. Each is a [`Table`]: its name, what a
//! row is, its columns, the indexes worth having, and the function that
//! produces its rows from a [`Run`]; a [`View`] is a query over them. A new
//! table (system calls from a replay analysis, exit timing) is one more
//! entry in [`TABLES`]: the schema, the loading, `export sqlite`, the error
//! listing and `provm query --schema` all follow from the list. A table
//! filled by replaying the run (`from_replay`) is filled only when a query
//! reads it, or `export sqlite --with-replay` asks.

mod blame;
mod events;
mod manifest;
mod provenance;
mod syscalls;

use rusqlite::{Statement, ToSql, Transaction};

use super::{QueryError, Run};

/// Every table, in the order they are created and listed.
pub const TABLES: &[Table] = &[
    manifest::MANIFEST,
    events::EVENTS,
    provenance::PROCESSES,
    provenance::FILES,
    provenance::EDGES,
    syscalls::SYSCALLS,
    blame::BLAME,
    blame::BLAME_DEVICES,
    blame::BLAME_VCPUS,
];

/// Every view.
pub const VIEWS: &[View] = &[events::EXITS, provenance::DEPENDS_ON];

pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    pub doc: &'static str,
}

/// What a column holds. SQLite stores booleans and timestamps as integers
/// (its type affinity, `sql_type`); a typed format (the Parquet export)
/// keeps them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Integer,
    Real,
    Text,
    /// 0 or 1 in SQLite.
    Boolean,
    /// Seconds since the Unix epoch.
    UnixSeconds,
    /// Nanoseconds since the Unix epoch.
    UnixNanos,
}

impl Kind {
    /// SQLite's type affinity: INTEGER, REAL or TEXT.
    pub fn sql_type(self) -> &'static str {
        match self {
            Kind::Integer | Kind::Boolean | Kind::UnixSeconds | Kind::UnixNanos => "INTEGER",
            Kind::Real => "REAL",
            Kind::Text => "TEXT",
        }
    }

    /// What `provm query --schema` calls it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Boolean => "BOOLEAN",
            Kind::UnixSeconds | Kind::UnixNanos => "TIMESTAMP",
            _ => self.sql_type(),
        }
    }
}

pub(super) const fn column(name: &'static str, kind: Kind, doc: &'static str) -> Column {
    Column { name, kind, doc }
}

/// Every table's first column: which run a row is of.
pub const RUN_COLUMN: Column = Column {
    name: "run",
    kind: Kind::Text,
    doc: "the run: its trace's path as given (in a Parquet dataset, the trace's SHA-256)",
};

pub struct Table {
    pub name: &'static str,
    /// What one row is.
    pub doc: &'static str,
    /// The columns after `run`.
    pub columns: &'static [Column],
    /// Column lists indexed in an exported database. Without `run`: it is
    /// long text, repeated in every entry of an index.
    pub indexes: &'static [&'static str],
    /// Inserts the rows of one run.
    pub fill: fn(&Run, &mut Rows<'_>) -> Result<(), QueryError>,
    /// Whether filling it replays the run (slow: as long as the run).
    pub from_replay: bool,
}

pub struct View {
    pub name: &'static str,
    pub doc: &'static str,
    /// The SELECT that defines it.
    pub select: &'static str,
    pub columns: &'static [Column],
}

impl Table {
    pub fn create_sql(&self) -> String {
        let columns: Vec<String> = std::iter::once(&RUN_COLUMN)
            .chain(self.columns)
            .map(|column| format!("{} {}", column.name, column.kind.sql_type()))
            .collect();
        format!("CREATE TABLE {} ({})", self.name, columns.join(", "))
    }

    pub fn index_sql(&self) -> impl Iterator<Item = String> + '_ {
        self.indexes.iter().enumerate().map(|(n, columns)| {
            format!(
                "CREATE INDEX {}_{n} ON {} ({columns})",
                self.name, self.name
            )
        })
    }

    fn insert_sql(&self) -> String {
        let placeholders = vec!["?"; self.columns.len() + 1].join(", ");
        format!("INSERT INTO {} VALUES ({placeholders})", self.name)
    }
}

impl View {
    pub fn create_sql(&self) -> String {
        format!("CREATE VIEW {} AS {}", self.name, self.select)
    }
}

/// Where a table's fill function puts its rows: one prepared INSERT,
/// reused for every row, inside the loading transaction; `run` is bound
/// once, the other columns row by row.
pub struct Rows<'a> {
    insert: Statement<'a>,
    width: usize,
}

impl<'a> Rows<'a> {
    pub fn new(tx: &'a Transaction<'_>, table: &Table, run: &str) -> Result<Self, QueryError> {
        let mut insert = tx.prepare(&table.insert_sql())?;
        insert.raw_bind_parameter(1, run)?;
        Ok(Rows {
            insert,
            width: table.columns.len(),
        })
    }

    /// Inserts one row: `values` are the columns after `run`, in order.
    pub fn insert(&mut self, values: &[&dyn ToSql]) -> Result<(), QueryError> {
        assert_eq!(values.len(), self.width, "one value per column");
        for (index, value) in values.iter().enumerate() {
            // Parameters count from 1, and 1 is `run`.
            self.insert.raw_bind_parameter(index + 2, value)?;
        }
        self.insert.raw_execute()?;
        Ok(())
    }
}
