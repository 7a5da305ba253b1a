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
