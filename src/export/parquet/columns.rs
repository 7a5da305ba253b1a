//! A table's columns as Arrow's: its schema, derived from the same
//! `query::Column`s that make the SQLite tables (so the two cannot drift),
//! and its rows, read out of the SQLite database the query tables were
//! loaded into, as record batches.

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
    TimestampNanosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use rusqlite::types::ValueRef;
use rusqlite::Connection;

use super::super::ExportError;
use crate::query::{Column, Kind, QueryError};

/// Rows per record batch (and so per Parquet row group at most): a
/// million events are not held in memory at once.
const BATCH_ROWS: usize = 64 * 1024;

/// The timestamps' zone: they count from the epoch, an instant.
const UTC: &str = "UTC";

fn data_type(kind: Kind) -> DataType {
    match kind {
        Kind::Integer => DataType::Int64,
        Kind::Real => DataType::Float64,
        Kind::Text => DataType::Utf8,
        Kind::Boolean => DataType::Boolean,
        // Parquet has no unit of seconds (arrow-rs would write plain
        // integers that other readers take for numbers): microseconds,
        // DuckDB's and Spark's own unit.
        Kind::UnixSeconds => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        Kind::UnixNanos => DataType::Timestamp(TimeUnit::Nanosecond, Some(UTC.into())),
    }
}

/// The Arrow schema of a table's columns (after `run`: a Hive partition's
/// key, the file does not repeat it). Every column may be null, as in
/// SQLite.
pub fn schema(columns: &[Column]) -> SchemaRef {
    let fields: Vec<Field> = columns
        .iter()
        .map(|column| Field::new(column.name, data_type(column.kind), true))
        .collect();
    Arc::new(Schema::new(fields))
}

/// One column's values as they are read.
enum Builder {
    Integer(Int64Builder),
    Real(Float64Builder),
    Text(StringBuilder),
    Boolean(BooleanBuilder),
    Seconds(TimestampMicrosecondBuilder),
    Nanos(TimestampNanosecondBuilder),
}

impl Builder {
    fn new(kind: Kind) -> Builder {
        match kind {
            Kind::Integer => Builder::Integer(Int64Builder::new()),
            Kind::Real => Builder::Real(Float64Builder::new()),
            Kind::Text => Builder::Text(StringBuilder::new()),
            Kind::Boolean => Builder::Boolean(BooleanBuilder::new()),
            Kind::UnixSeconds => {
                Builder::Seconds(TimestampMicrosecondBuilder::new().with_timezone(UTC))
            }
            Kind::UnixNanos => Builder::Nanos(TimestampNanosecondBuilder::new().with_timezone(UTC)),
        }
    }

    /// Appends one SQLite value; `None` when it is not of the column's kind
    /// (a table that fills a column with the wrong type: a bug).
    fn append(&mut self, value: ValueRef<'_>) -> Option<()> {
        match (self, value) {
            (Builder::Integer(b), ValueRef::Null) => b.append_null(),
            (Builder::Real(b), ValueRef::Null) => b.append_null(),
            (Builder::Text(b), ValueRef::Null) => b.append_null(),
            (Builder::Boolean(b), ValueRef::Null) => b.append_null(),
            (Builder::Seconds(b), ValueRef::Null) => b.append_null(),
            (Builder::Nanos(b), ValueRef::Null) => b.append_null(),
            (Builder::Integer(b), ValueRef::Integer(n)) => b.append_value(n),
            (Builder::Seconds(b), ValueRef::Integer(n)) => {
                b.append_value(n.checked_mul(1_000_000)?)
            }
            (Builder::Nanos(b), ValueRef::Integer(n)) => b.append_value(n),
            (Builder::Boolean(b), ValueRef::Integer(n)) => b.append_value(n != 0),
            (Builder::Real(b), ValueRef::Real(x)) => b.append_value(x),
            (Builder::Text(b), ValueRef::Text(text)) => {
                b.append_value(std::str::from_utf8(text).ok()?)
            }
            _ => return None,
        }
        Some(())
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Integer(b) => Arc::new(b.finish()),
            Builder::Real(b) => Arc::new(b.finish()),
            Builder::Text(b) => Arc::new(b.finish()),
            Builder::Boolean(b) => Arc::new(b.finish()),
            Builder::Seconds(b) => Arc::new(b.finish()),
            Builder::Nanos(b) => Arc::new(b.finish()),
        }
    }
}

/// Reads every row of the table or view `name` in `db` (which holds one
/// run) and hands them to `write` in record batches of `schema(columns)`;
/// the number of rows.
pub fn batches(
    db: &Connection,
    name: &str,
    columns: &[Column],
    mut write: impl FnMut(RecordBatch) -> Result<(), ExportError>,
) -> Result<u64, ExportError> {
    let schema = schema(columns);
    let names: Vec<&str> = columns.iter().map(|column| column.name).collect();
    let sql = format!("SELECT {} FROM {name}", names.join(", "));
    let mut statement = db.prepare(&sql).map_err(QueryError::from)?;
    let mut rows = statement.query(()).map_err(QueryError::from)?;
    let mut builders: Vec<Builder> = columns.iter().map(|c| Builder::new(c.kind)).collect();
    let (mut pending, mut total) = (0, 0);
    let mut flush = |builders: &mut [Builder]| {
        let arrays = builders.iter_mut().map(Builder::finish).collect();
        let batch = RecordBatch::try_new(schema.clone(), arrays)
            .expect("the builders are made from the schema's kinds");
        write(batch)
    };
    while let Some(row) = rows.next().map_err(QueryError::from)? {
        for (index, (builder, column)) in builders.iter_mut().zip(columns).enumerate() {
            let value = row.get_ref(index).map_err(QueryError::from)?;
            if builder.append(value).is_none() {
                panic!(
                    "{name}.{}: a {:?} value in a {} column: the table's fill and its columns disagree",
                    column.name,
                    value.data_type(),
                    column.kind.name()
                );
            }
        }
        pending += 1;
        total += 1;
        if pending == BATCH_ROWS {
            flush(&mut builders)?;
            pending = 0;
        }
    }
    // A table with no rows still gets its (empty) batch: the file then has
    // the schema.
    if pending > 0 || total == 0 {
        flush(&mut builders)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::{RUN_COLUMN, TABLES, VIEWS};
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, TimestampMicrosecondType};
    use arrow_array::Array;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;

    /// The SQLite affinity a column of `data_type` is stored with.
    fn affinity(data_type: &DataType) -> &'static str {
        match data_type {
            DataType::Int64 | DataType::Boolean | DataType::Timestamp(..) => "INTEGER",
            DataType::Float64 => "REAL",
            DataType::Utf8 => "TEXT",
            other => panic!("no SQLite affinity for {other}"),
        }
    }

    #[test]
    fn every_arrow_schema_is_its_sqlite_tables() {
        let mut db = Connection::open_in_memory().unwrap();
        crate::query::load(&mut db, &[], true).unwrap();
        let entries = TABLES
            .iter()
            .map(|t| (t.name, t.columns))
            .chain(VIEWS.iter().map(|v| (v.name, v.columns)));
        for (name, columns) in entries {
            let mut statement = db
                .prepare(&format!(
                    "SELECT name, type FROM pragma_table_info('{name}')"
                ))
                .unwrap();
            let sqlite: Vec<(String, String)> = statement
                .query_map((), |row| Ok((row.get(0)?, row.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            // `run` is the partition's key, not a column of the files.
            let arrow: Vec<(String, String)> = std::iter::once((RUN_COLUMN.name, "TEXT"))
                .chain(
                    schema(columns)
                        .fields()
                        .iter()
                        .map(|field| (field.name().as_str(), affinity(field.data_type()))),
                )
                .map(|(name, affinity)| (name.to_owned(), affinity.to_owned()))
                .collect();
            assert_eq!(arrow, sqlite, "{name}");
        }
    }

    const COLUMNS: &[Column] = &[
        Column {
            name: "n",
            kind: Kind::Integer,
            doc: "",
        },
        Column {
            name: "yes",
            kind: Kind::Boolean,
            doc: "",
        },
        Column {
            name: "at",
            kind: Kind::UnixSeconds,
            doc: "",
        },
        Column {
            name: "name",
            kind: Kind::Text,
            doc: "",
        },
    ];

    #[test]
    fn rows_go_through_parquet_in_batches_typed() {
        let db = Connection::open_in_memory().unwrap();
        db.execute_batch(
            "CREATE TABLE t (n INTEGER, yes INTEGER, at INTEGER, name TEXT);
             WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < 69999)
             INSERT INTO t SELECT n, n % 2, 1700000000 + n, CASE WHEN n % 3 THEN 'x' || n END FROM i;",
        )
        .unwrap();
        let file = tempfile::tempfile().unwrap();
        let mut writer =
            ArrowWriter::try_new(file.try_clone().unwrap(), schema(COLUMNS), None).unwrap();
        let mut sizes = Vec::new();
        let rows = batches(&db, "t", COLUMNS, |batch| {
            sizes.push(batch.num_rows());
            writer.write(&batch).unwrap();
            Ok(())
        })
        .unwrap();
        writer.close().unwrap();
        assert_eq!(
            (rows, sizes),
            (70_000, vec![BATCH_ROWS, 70_000 - BATCH_ROWS])
        );

        let read: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let batch = &read[0];
        assert_eq!(batch.schema(), schema(COLUMNS));
        assert_eq!(batch.column(0).as_primitive::<Int64Type>().value(7), 7);
        assert!(batch.column(1).as_boolean().value(7));
        let at = batch.column(2).as_primitive::<TimestampMicrosecondType>();
        assert_eq!(at.value(7), 1_700_000_007_000_000);
        let name = batch.column(3).as_string::<i32>();
        assert_eq!(name.value(7), "x7");
        assert!(name.is_null(6));
    }

    #[test]
    fn an_empty_table_still_has_its_schema() {
        let db = Connection::open_in_memory().unwrap();
        db.execute("CREATE TABLE t (n, yes, at, name)", ()).unwrap();
        let mut seen = Vec::new();
        let rows = batches(&db, "t", COLUMNS, |batch| {
            seen.push(batch.num_rows());
            Ok(())
        })
        .unwrap();
        assert_eq!((rows, seen), (0, vec![0]));
    }
}
