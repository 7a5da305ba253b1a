//! Several runs in one graph (`provm graph RUN...`): a file one run left
//! written and another read, with the same SHA-256, is one entity, so the
//! graph shows which run fed which. Each run's nodes keep their ids under
//! `runN/`; the content the runs share is one node, `sha256/DIGEST`.

use std::collections::{BTreeMap, HashMap};

use super::files;
use super::model::{
    Entity, EntityKind, Provenance, Relation, EMPTY_SHA256, NAME_SEPARATOR, VM_ACTIVITY,
};

/// One run's graph and what to call it (its trace's file name).
pub struct NamedRun {
    pub name: String,
    pub graph: Provenance,
}

/// The graph of `runs`, in the order given. One run's is its own graph,
/// unchanged.
pub fn combine(mut runs: Vec<NamedRun>) -> Provenance {
    if runs.len() == 1 {
        return runs.pop().expect("one run").graph;
    }
    let boundaries: Vec<BTreeMap<&str, &str>> = runs
        .iter()
        .map(|run| boundary_by_digest(&run.graph))
        .collect();
    let mut in_runs: HashMap<&str, usize> = HashMap::new();
    for boundary in &boundaries {
        for digest in boundary.keys() {
            *in_runs.entry(digest).or_default() += 1;
        }
    }
    let mut combined = Provenance::default();
    let mut shared: BTreeMap<String, usize> = BTreeMap::new();
    for (index, (run, boundary)) in runs.iter().zip(&boundaries).enumerate() {
        let prefix = format!("run{}/", index + 1);
        let shared_ids: HashMap<&str, String> = boundary
            .iter()
            .filter(|(digest, _)| in_runs[*digest] > 1)
            .map(|(digest, id)| (*id, shared_id(digest)))
            .collect();
        let id = |old: &str| {
            shared_ids
                .get(old)
                .cloned()
                .unwrap_or_else(|| format!("{prefix}{old}"))
        };
        for activity in &run.graph.activities {
            let mut activity = activity.clone();
            if activity.id == VM_ACTIVITY {
                activity.exe = format!("{} {}", activity.exe, run.name);
            }
            activity.id = id(&activity.id);
            combined.activities.push(activity);
        }
        for original in &run.graph.entities {
            let entity = Entity {
                id: id(&original.id),
                ..original.clone()
            };
            match shared.get(&entity.id) {
                Some(&at) => also_named(&mut combined.entities[at], &entity.name),
                None => {
                    if shared_ids.contains_key(original.id.as_str()) {
                        shared.insert(entity.id.clone(), combined.entities.len());
                    }
                    combined.entities.push(entity);
                }
            }
        }
        combined.relations.extend(
            run.graph
                .relations
                .iter()
                .map(|relation| renamed(relation, &id)),
        );
    }
    combined
}

/// The node the runs share for content `digest`.
fn shared_id(digest: &str) -> String {
    format!("sha256/{digest}")
}

/// Adds `name` to the names of a shared node, once.
fn also_named(entity: &mut Entity, name: &str) {
    if !entity.names().any(|had| had == name) {
        entity.name = format!("{}{NAME_SEPARATOR}{name}", entity.name);
    }
}

/// The entities at the run's boundary, by digest: what it left written
/// (guest files, console streams) before what it read (guest files, the
/// VM's inputs), so that content a run both read and wrote is shared as
/// its output; one entity per digest, none for empty content.
fn boundary_by_digest(graph: &Provenance) -> BTreeMap<&str, &str> {
    let of_kind = |kind| graph.entities.iter().filter(move |e| e.kind == kind);
    let outputs = files::outputs(graph).into_values().map(|o| o.version);
    let inputs = files::inputs(graph).into_iter();
    let mut by_digest = BTreeMap::new();
    for entity in outputs
        .chain(of_kind(EntityKind::VmOutput))
        .chain(inputs)
        .chain(of_kind(EntityKind::VmInput))
    {
        if let Some(digest) = entity.sha256.as_ref().filter(|d| *d != EMPTY_SHA256) {
            by_digest
                .entry(digest.as_str())
                .or_insert(entity.id.as_str());
        }
    }
    by_digest
}

/// `relation` with its ends renamed by `id`.
fn renamed(relation: &Relation, id: &impl Fn(&str) -> String) -> Relation {
    match relation {
        Relation::Used {
            activity,
            entity,
            role,
        } => Relation::Used {
            activity: id(activity),
            entity: id(entity),
            role: role.clone(),
        },
        Relation::WasGeneratedBy { entity, activity } => Relation::WasGeneratedBy {
            entity: id(entity),
            activity: id(activity),
        },
        Relation::WasInformedBy {
            informed,
            informant,
            how,
        } => Relation::WasInformedBy {
            informed: id(informed),
            informant: id(informant),
            how: how.clone(),
        },
        Relation::WasStartedBy { activity, starter } => Relation::WasStartedBy {
            activity: id(activity),
            starter: id(starter),
        },
        Relation::WasDerivedFrom {
            generated,
            used,
            activity,
            how,
        } => Relation::WasDerivedFrom {
            generated: id(generated),
            used: id(used),
            activity: id(activity),
            how: how.clone(),
        },
        Relation::WasInvalidatedBy { entity, activity } => Relation::WasInvalidatedBy {
            entity: id(entity),
            activity: id(activity),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provenance::model::Activity;

    fn file(id: &str, path: &str, sha256: &str) -> Entity {
        Entity::test_file(id, path, sha256)
    }

    /// A run whose one process read `read` and wrote `wrote`.
    fn run(name: &str, read: Entity, wrote: Entity) -> NamedRun {
        let relations = vec![
            Relation::Used {
                activity: "process/0".into(),
                entity: read.id.clone(),
                role: "read".into(),
            },
            Relation::WasGeneratedBy {
                entity: wrote.id.clone(),
                activity: "process/0".into(),
            },
        ];
        let process = |id: &str| Activity {
            id: id.into(),
            exe: "provm run".into(),
            ..Activity::default()
        };
        NamedRun {
            name: name.into(),
            graph: Provenance {
                activities: vec![process(VM_ACTIVITY), process("process/0")],
                entities: vec![read, wrote],
                relations,
            },
        }
    }

    #[test]
    fn what_one_run_wrote_and_the_next_read_is_one_node() {
        let first = run(
            "a.provm",
            file("file/0", "/data/in.txt", "11"),
            file("file/1", "/out/sorted.txt", "22"),
        );
        let second = run(
            "b.provm",
            file("file/0", "/in/sorted.txt", "22"),
            file("file/1", "/out/empty.txt", EMPTY_SHA256),
        );
        let alone = combine(vec![run(
            "a.provm",
            file("file/0", "/data/in.txt", "11"),
            file("file/1", "/out/sorted.txt", "22"),
        )]);
        assert_eq!(alone, first.graph, "one run's graph is its own");

        let both = combine(vec![first, second]);
        let shared = both.entity("sha256/22").expect("the shared node");
        assert_eq!(shared.name, "/out/sorted.txt | /in/sorted.txt");
        assert!(both.relations.contains(&Relation::WasGeneratedBy {
            entity: "sha256/22".into(),
            activity: "run1/process/0".into(),
        }));
        assert!(both.relations.contains(&Relation::Used {
            activity: "run2/process/0".into(),
            entity: "sha256/22".into(),
            role: "read".into(),
        }));
        let ids: Vec<&str> = both.entities.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["run1/file/0", "sha256/22", "run2/file/1"]);
        assert_eq!(both.activity("run2/vm").unwrap().exe, "provm run b.provm");
        // The lineage of a shared file follows it by either name.
        let upstream =
            super::super::lineage(&both, "/in/sorted.txt", super::super::Direction::Inputs)
                .unwrap();
        assert!(upstream.entity("run1/file/0").is_some(), "{upstream:#?}");
    }
}
