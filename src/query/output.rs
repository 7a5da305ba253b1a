//! Running a query and writing its result: an aligned table for people,
//! CSV or JSON for programs.

use std::io::Write;

use rusqlite::types::Value;
use rusqlite::Connection;
use serde::ser::{SerializeMap, SerializeSeq};

use super::database::schema;
use super::QueryError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Columns aligned, for people.
    Table,
    /// RFC 4180 CSV with a header row.
    Csv,
    /// A JSON array of objects, one per row, keys in column order.
    Json,
}

/// Runs `sql` on `db` and writes its rows to `out` in `format`.
pub fn print(
    db: &Connection,
    sql: &str,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), QueryError> {
    let (columns, rows) = run(db, sql).map_err(|error| QueryError::Sql {
        message: format!("the query failed: {error}"),
        tables: format!("the tables and their columns:\n{}", schema(false)),
    })?;
    match format {
        OutputFormat::Table => table(&columns, &rows, out)?,
        OutputFormat::Csv => csv(&columns, &rows, out)?,
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &JsonRows(&columns, &rows))
                .map_err(std::io::Error::from)?;
            writeln!(out)?;
        }
    }
    Ok(())
}

type Rows = Vec<Vec<Value>>;

fn run(db: &Connection, sql: &str) -> rusqlite::Result<(Vec<String>, Rows)> {
    let mut statement = db.prepare(sql)?;
    let columns: Vec<String> = statement.column_names().map(String::from).collect();
    let rows = statement
        .query_map((), |row| {
            (0..columns.len()).map(|i| row.get::<_, Value>(i)).collect()
        })?
        .collect::<rusqlite::Result<Rows>>()?;
    Ok((columns, rows))
}

/// A value as text; NULL is empty, as sqlite3's shell shows it.
fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Integer(n) => n.to_string(),
        // Debug keeps a whole number's `.0`: 72.0, as SQLite prints it.
        Value::Real(x) => format!("{x:?}"),
        Value::Text(s) => s.clone(),
        Value::Blob(bytes) => provm_trace::hex(bytes),
    }
}

/// Columns padded to their widest cell, numeric columns (every value a
/// number or NULL) aligned right.
fn table(columns: &[String], rows: &Rows, out: &mut dyn Write) -> std::io::Result<()> {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(text).collect())
        .collect();
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .chain([columns[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let numeric: Vec<bool> = (0..columns.len())
        .map(|i| {
            rows.iter()
                .all(|row| matches!(row[i], Value::Integer(_) | Value::Real(_) | Value::Null))
        })
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .zip(&numeric)
            .map(|((cell, &width), &right)| match right {
                true => format!("{cell:>width$}"),
                false => format!("{cell:<width$}"),
            })
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(columns))?;
    let rule: Vec<String> = widths.iter().map(|&width| "-".repeat(width)).collect();
    writeln!(out, "{}", line(&rule))?;
    for row in &cells {
        writeln!(out, "{}", line(row))?;
    }
    Ok(())
}

fn csv(columns: &[String], rows: &Rows, out: &mut dyn Write) -> Result<(), csv::Error> {
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(columns)?;
    for row in rows {
        writer.write_record(row.iter().map(text))?;
    }
    writer.flush()?;
    Ok(())
}

/// The rows as JSON objects whose keys keep the columns' order.
struct JsonRows<'a>(&'a [String], &'a Rows);

impl serde::Serialize for JsonRows<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.1.len()))?;
        for row in self.1 {
            seq.serialize_element(&JsonRow(self.0, row))?;
        }
        seq.end()
    }
}

struct JsonRow<'a>(&'a [String], &'a [Value]);

impl serde::Serialize for JsonRow<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (column, value) in self.0.iter().zip(self.1) {
            match value {
                Value::Null => map.serialize_entry(column, &())?,
                Value::Integer(n) => map.serialize_entry(column, n)?,
                Value::Real(x) => map.serialize_entry(column, x)?,
                Value::Text(_) | Value::Blob(_) => map.serialize_entry(column, &text(value))?,
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printed(sql: &str, format: OutputFormat) -> String {
        let db = Connection::open_in_memory().unwrap();
        let mut out = Vec::new();
        print(&db, sql, format, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    const SQL: &str = "SELECT 'port write' AS kind, 12 AS n, NULL AS device \
                       UNION ALL SELECT 'HLT, \"ok\"', 3, 'pic'";

    #[test]
    fn tables_align_and_numbers_go_right() {
        assert_eq!(
            printed(SQL, OutputFormat::Table),
            "kind         n  device\n\
             ----------  --  ------\n\
             port write  12\n\
             HLT, \"ok\"    3  pic\n"
        );
    }

    #[test]
    fn csv_quotes_and_json_keeps_types_and_order() {
        assert_eq!(
            printed(SQL, OutputFormat::Csv),
            "kind,n,device\nport write,12,\n\"HLT, \"\"ok\"\"\",3,pic\n"
        );
        let json = printed(SQL, OutputFormat::Json);
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed[0]["n"], 12);
        assert!(parsed[0]["device"].is_null());
        assert!(json.find("\"kind\"").unwrap() < json.find("\"n\"").unwrap());
    }

    #[test]
    fn a_bad_query_lists_the_tables() {
        let db = Connection::open_in_memory().unwrap();
        let error = print(&db, "SELEC 1", OutputFormat::Table, &mut Vec::new()).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("syntax error"), "{message}");
        assert!(message.contains("events(run, idx"), "{message}");
    }
}
