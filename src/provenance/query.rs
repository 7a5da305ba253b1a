//! The two questions users ask of a run: what did this file depend on
//! (`--inputs-of`), and what did this input affect (`--outputs-of`).
//! Both follow data flow (used, wasGeneratedBy, wasDerivedFrom), not which
//! process started which.

use std::collections::HashSet;

use super::model::{EntityKind, Provenance};
use super::ProvenanceError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Everything the file's last version came from.
    Inputs,
    /// Everything any version of the file fed into.
    Outputs,
}

/// The part of `document` upstream or downstream of `path`.
pub fn lineage(
    document: &Provenance,
    path: &str,
    direction: Direction,
) -> Result<Provenance, ProvenanceError> {
    let versions: Vec<&str> = document
        .entities
        .iter()
        .filter(|entity| entity.kind == EntityKind::File && entity.names().any(|name| name == path))
        .map(|entity| entity.id.as_str())
        .collect();
    let start: Vec<&str> = match direction {
        Direction::Inputs => versions.last().copied().into_iter().collect(),
        Direction::Outputs => versions,
    };
    if start.is_empty() {
        return Err(not_touched(document, path));
    }
    let mut reached: HashSet<String> = start.iter().map(|id| id.to_string()).collect();
    let mut frontier: Vec<String> = reached.iter().cloned().collect();
    while let Some(node) = frontier.pop() {
        for relation in document.relations.iter().filter(|r| r.carries_data()) {
            let (subject, object) = relation.ends();
            let (from, to) = match direction {
                Direction::Inputs => (subject, object),
                Direction::Outputs => (object, subject),
            };
            if from == node && reached.insert(to.to_owned()) {
                frontier.push(to.to_owned());
            }
        }
    }
    Ok(document.restricted_to(&reached))
}

/// The error for a path the run never touched, naming files it did touch
/// with the same file name, if any.
fn not_touched(document: &Provenance, path: &str) -> ProvenanceError {
    let name = path.rsplit('/').next().unwrap_or(path);
    let mut similar: Vec<String> = document
        .entities
        .iter()
        .filter(|entity| entity.kind == EntityKind::File)
        .flat_map(|entity| entity.names())
        .filter(|touched| touched.rsplit('/').next() == Some(name))
        .map(str::to_owned)
        .collect();
    similar.sort();
    similar.dedup();
    ProvenanceError::NotTouched {
        path: path.to_owned(),
        similar,
    }
}
