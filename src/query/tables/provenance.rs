//! `processes`, `files` and `edges`: the provenance graph of a run
//! recorded with `--prov` (empty for the others; `manifest.has_provenance`
//! tells them apart).

use std::collections::HashMap;

use super::Kind::{Integer, Text, UnixNanos};
use super::{column, Rows, Table, View};
use crate::provenance::{Provenance, Relation, VM_ACTIVITY};
use crate::query::{QueryError, Run};

pub const PROCESSES: Table = Table {
    name: "processes",
    doc: "one row per program a guest process ran (an exec starts a new row)",
    columns: &[
        column(
            "id",
            Text,
            "its node in the graph (edges.source, edges.target)",
        ),
        column("pid", Integer, "the guest's process id"),
        column("exe", Text, "the executable"),
        column("argv", Text, "its arguments, a JSON array"),
        column(
            "command",
            Text,
            "its name as called and its arguments, for people",
        ),
        column(
            "start_ns",
            UnixNanos,
            "start, guest wall clock, ns since the epoch",
        ),
        column(
            "end_ns",
            UnixNanos,
            "end, guest wall clock, ns since the epoch",
        ),
        column(
            "outcome",
            Text,
            "exit N, signal N, or NULL when it went on with an exec",
        ),
        column(
            "started_by",
            Text,
            "the id of the process that started it (vm: the command itself)",
        ),
        column(
            "how",
            Text,
            "how: fork, exec, or job (the VM started the command)",
        ),
    ],
    indexes: &["id", "pid"],
    fill: fill_processes,
    from_replay: false,
};

pub const FILES: Table = Table {
    name: "files",
    doc: "one row per version of a file (and per environment and VM input or output)",
    columns: &[
        column(
            "id",
            Text,
            "its node in the graph (edges.source, edges.target)",
        ),
        column("kind", Text, "file, environment, vm-input or vm-output"),
        column(
            "name",
            Text,
            "the file's path in the guest, or the input's or output's name",
        ),
        column(
            "sha256",
            Text,
            "the content's SHA-256 (NULL where it was not read: devices, /proc)",
        ),
        column("size", Integer, "bytes"),
        column(
            "content",
            Text,
            "an environment's entries or a VM input's text, a JSON array",
        ),
    ],
    indexes: &["id", "name"],
    fill: fill_files,
    from_replay: false,
};

pub const EDGES: Table = Table {
    name: "edges",
    doc: "one row per PROV relation between a process and a file or two of either",
    columns: &[
        column("relation", Text, "used, wasGeneratedBy, wasInformedBy, wasStartedBy, wasDerivedFrom, wasInvalidatedBy"),
        column("source", Text, "the subject's id: the process that used, the file generated..."),
        column("target", Text, "the object's id"),
        column("detail", Text, "used: read, execute or environment; wasInformedBy: fork, exec or job; wasDerivedFrom: write or rename"),
        column("via", Text, "wasDerivedFrom: the process that made the derivation"),
    ],
    indexes: &["source", "target"],
    fill: fill_edges,
    from_replay: false,
};

/// Content a run depends on, by digest: across runs, "which runs depend on
/// this file" is `SELECT DISTINCT run FROM depends_on WHERE sha256 = ?`.
/// Only the run's own rows (what it made itself is left out), so each
/// run's Parquet partition holds its part of the view.
pub const DEPENDS_ON: View = View {
    name: "depends_on",
    doc: "one row per use of content the run did not make: the guest files it read or ran, and the VM's inputs, by SHA-256",
    select: "SELECT f.run, f.sha256, f.kind, f.name AS path, e.source AS process, \
             CAST(COALESCE(p.command, 'provm run') AS TEXT) AS command, e.detail AS how \
             FROM files f \
             JOIN edges e ON e.run = f.run AND e.relation = 'used' AND e.target = f.id \
             LEFT JOIN processes p ON p.run = e.run AND p.id = e.source \
             WHERE f.sha256 IS NOT NULL AND f.kind IN ('file', 'vm-input') AND NOT EXISTS \
             (SELECT 1 FROM edges g WHERE g.run = f.run AND g.relation = 'wasGeneratedBy' AND g.source = f.id)",
    columns: &[
        column("sha256", Text, "the content's SHA-256: the same in every run that used it"),
        column("kind", Text, "file or vm-input"),
        column("path", Text, "its path in the guest as this run saw it, or the VM input's name"),
        column("process", Text, "the id of the process that used it (processes.id; vm: the VM)"),
        column("command", Text, "that process's command, for people"),
        column("how", Text, "read, execute, or input (the VM's)"),
    ],
};

fn graph(run: &Run) -> Option<&Provenance> {
    run.provenance.as_ref()
}

fn json(items: &[String]) -> String {
    serde_json::to_string(items).expect("strings serialise")
}

fn fill_processes(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let Some(graph) = graph(run) else {
        return Ok(());
    };
    let mut started_by = HashMap::new();
    let mut how = HashMap::new();
    for relation in &graph.relations {
        match relation {
            Relation::WasStartedBy { activity, starter } => {
                started_by.insert(activity.as_str(), starter.as_str());
            }
            Relation::WasInformedBy {
                informed, how: h, ..
            } => {
                how.insert(informed.as_str(), h.as_str());
            }
            _ => {}
        }
    }
    for process in graph.activities.iter().filter(|a| a.id != VM_ACTIVITY) {
        let id = process.id.as_str();
        rows.insert(&[
            &id,
            &process.pid,
            &process.exe,
            &json(&process.argv),
            &process.label(),
            &(process.start_ns as i64),
            &(process.end_ns as i64),
            &process.outcome,
            &started_by.get(id),
            &how.get(id),
        ])?;
    }
    Ok(())
}

fn fill_files(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let Some(graph) = graph(run) else {
        return Ok(());
    };
    for entity in &graph.entities {
        let kind = serde_json::to_value(entity.kind).expect("a kind serialises");
        let content = (!entity.content.is_empty()).then(|| json(&entity.content));
        rows.insert(&[
            &entity.id,
            &kind.as_str(),
            &entity.name,
            &entity.sha256,
            &(entity.size as i64),
            &content,
        ])?;
    }
    Ok(())
}

fn fill_edges(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let Some(graph) = graph(run) else {
        return Ok(());
    };
    for relation in &graph.relations {
        let (source, target) = relation.ends();
        let (name, detail, via) = match relation {
            Relation::Used { role, .. } => ("used", Some(role), None),
            Relation::WasGeneratedBy { .. } => ("wasGeneratedBy", None, None),
            Relation::WasInformedBy { how, .. } => ("wasInformedBy", Some(how), None),
            Relation::WasStartedBy { .. } => ("wasStartedBy", None, None),
            Relation::WasDerivedFrom { how, activity, .. } => {
                ("wasDerivedFrom", Some(how), Some(activity))
            }
            Relation::WasInvalidatedBy { .. } => ("wasInvalidatedBy", None, None),
        };
        rows.insert(&[&name, &source, &target, &detail, &via])?;
    }
    Ok(())
}
