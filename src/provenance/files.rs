//! A run's files as inputs and outputs: what it read that it did not make,
//! and what it left written. `export oci` packs the first, `repro`
//! compares the second, `export ro-crate` lists both.

use std::collections::{BTreeMap, BTreeSet};

use provm_guest_agent::paths::is_kernel_file;

use super::model::{Entity, EntityKind, Provenance, Relation};

/// A file in the guest, not a kernel interface (/proc, /sys, /dev).
fn is_guest_file(entity: &Entity) -> bool {
    entity.kind == EntityKind::File
        && entity.name.starts_with('/')
        && !is_kernel_file(entity.name.as_bytes())
}

/// The file versions the run used (read or ran) and did not make, each
/// once, in the order of their first use.
pub fn inputs(graph: &Provenance) -> Vec<&Entity> {
    let generated: BTreeSet<&str> = graph
        .relations
        .iter()
        .filter_map(|relation| match relation {
            Relation::WasGeneratedBy { entity, .. } => Some(entity.as_str()),
            _ => None,
        })
        .collect();
    let mut seen = BTreeSet::new();
    graph
        .relations
        .iter()
        .filter_map(|relation| match relation {
            Relation::Used { entity, .. } if !generated.contains(entity.as_str()) => {
                graph.entity(entity)
            }
            _ => None,
        })
        .filter(|entity| is_guest_file(entity) && seen.insert(entity.id.as_str()))
        .collect()
}

/// A file the run left written: its last version and the activity that
/// generated it.
pub struct Output<'a> {
    pub version: &'a Entity,
    pub writer: &'a str,
}

/// Every file the run left written (its last version; not the ones it
/// deleted again), by path.
pub fn outputs(graph: &Provenance) -> BTreeMap<&str, Output<'_>> {
    let mut files: BTreeMap<&str, Output<'_>> = BTreeMap::new();
    for relation in &graph.relations {
        match relation {
            Relation::WasGeneratedBy { entity, activity } => {
                if let Some(version) = graph.entity(entity).filter(|e| is_guest_file(e)) {
                    files.insert(
                        &version.name,
                        Output {
                            version,
                            writer: activity,
                        },
                    );
                }
            }
            Relation::WasInvalidatedBy { entity, .. } => {
                // Deleted as last written: the run left no such file.
                if let Some(deleted) = graph.entity(entity) {
                    if files
                        .get(deleted.name.as_str())
                        .is_some_and(|last| last.version.id == *entity)
                    {
                        files.remove(deleted.name.as_str());
                    }
                }
            }
            _ => {}
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(id: &str, path: &str) -> Entity {
        Entity {
            id: id.into(),
            kind: EntityKind::File,
            name: path.into(),
            sha256: Some(format!("{id} digest")),
            size: 1,
            content: Vec::new(),
        }
    }

    fn used(entity: &str) -> Relation {
        Relation::Used {
            activity: "process/1".into(),
            entity: entity.into(),
            role: "read".into(),
        }
    }

    #[test]
    fn inputs_are_the_guest_files_used_and_not_made_each_once() {
        let graph = Provenance {
            entities: vec![
                file("file/1", "/data/in.txt"),
                file("file/2", "/tmp/mid.txt"),
                file("file/3", "/proc/self/stat"),
                file("file/4", "/bin/sort"),
            ],
            relations: vec![
                used("file/4"),
                used("file/1"),
                Relation::WasGeneratedBy {
                    entity: "file/2".into(),
                    activity: "process/1".into(),
                },
                used("file/2"),
                used("file/3"),
                used("file/1"),
            ],
            ..Provenance::default()
        };
        let names: Vec<&str> = inputs(&graph)
            .iter()
            .map(|file| file.name.as_str())
            .collect();
        assert_eq!(names, ["/bin/sort", "/data/in.txt"]);
        let outputs: Vec<&str> = outputs(&graph).into_keys().collect();
        assert_eq!(outputs, ["/tmp/mid.txt"]);
    }
}
