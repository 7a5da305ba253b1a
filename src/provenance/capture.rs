//! Builds a run's [`Provenance`] from the agent's records and what the
//! host knows of the VM's boundary.

use std::collections::HashMap;

use provm_engine::digest::Digested;
use provm_guest_agent::ProvRecord;

use super::model::{Activity, Entity, EntityKind, Provenance, Relation, VM_ACTIVITY};

/// Something that crossed the VM's boundary, by content.
#[derive(Clone, Debug)]
pub struct Boundary {
    /// `image`, `backing-file-N`, `kernel`, `initramfs`, `command`,
    /// `entropy`, `clock`, `stdout`, `stderr`.
    pub name: String,
    pub sha256: String,
    pub size: u64,
    /// A file's name (its host path only when kept, see `host_paths`) or
    /// the text itself, for people.
    pub content: Vec<String>,
}

impl Boundary {
    /// What passed a `HashingWriter`, as the boundary entity `name`.
    pub fn passed(name: &str, digested: Digested, content: Vec<String>) -> Self {
        Boundary {
            name: name.into(),
            sha256: digested.sha256,
            size: digested.size,
            content,
        }
    }
}

/// What the host knows of the run: its inputs and outputs at the boundary.
#[derive(Clone, Debug, Default)]
pub struct VmBoundary {
    pub inputs: Vec<Boundary>,
    pub outputs: Vec<Boundary>,
    pub start_ns: u64,
    pub end_ns: u64,
}

fn process_id(id: u32) -> String {
    format!("process/{id}")
}

fn file_id(id: u32) -> String {
    format!("file/{id}")
}

fn env_id(id: u32) -> String {
    format!("env/{id}")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The provenance document for `records` (in the agent's order) and `vm`.
pub fn build(records: &[ProvRecord], vm: &VmBoundary) -> Provenance {
    let mut document = Provenance::default();
    let mut started = Vec::new();
    // (process, file, seq) of reads, to derive what each write came from.
    let mut reads: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for record in records {
        match record {
            ProvRecord::Environment { id, entries } => document.entities.push(Entity {
                id: env_id(*id),
                kind: EntityKind::Environment,
                name: format!("environment {id}"),
                sha256: None,
                size: 0,
                content: entries.iter().map(|entry| text(entry)).collect(),
            }),
            ProvRecord::File(file) => document.entities.push(Entity {
                id: file_id(file.id),
                kind: EntityKind::File,
                name: text(&file.path),
                sha256: (!file.sha256.is_empty()).then(|| provm_trace::hex(&file.sha256)),
                size: file.size,
                content: Vec::new(),
            }),
            ProvRecord::Process(process) => {
                document.activities.push(Activity {
                    id: process_id(process.id),
                    pid: process.pid,
                    exe: text(&process.exe),
                    argv: process.argv.iter().map(|arg| text(arg)).collect(),
                    start_ns: process.start_ns,
                    end_ns: process.end_ns,
                    outcome: process.outcome.map(|outcome| outcome.to_string()),
                });
                document.relations.push(Relation::Used {
                    activity: process_id(process.id),
                    entity: env_id(process.env),
                    role: "environment".into(),
                });
            }
            ProvRecord::Started {
                process,
                starter,
                exec,
            } => {
                started.push(*process);
                document.relations.push(Relation::WasInformedBy {
                    informed: process_id(*process),
                    informant: process_id(*starter),
                    how: if *exec { "exec" } else { "fork" }.into(),
                });
                document.relations.push(Relation::WasStartedBy {
                    activity: process_id(*process),
                    starter: process_id(*starter),
                });
            }
            ProvRecord::Used {
                process,
                file,
                execute,
                seq,
            } => {
                if !execute {
                    reads.entry(*process).or_default().push((*file, *seq));
                }
                document.relations.push(Relation::Used {
                    activity: process_id(*process),
                    entity: file_id(*file),
                    role: if *execute { "execute" } else { "read" }.into(),
                });
            }
            ProvRecord::Generated { file, process, seq } => {
                document.relations.push(Relation::WasGeneratedBy {
                    entity: file_id(*file),
                    activity: process_id(*process),
                });
                let earlier = reads.get(process).into_iter().flatten();
                for (used, _) in earlier.filter(|(used, read)| read < seq && used != file) {
                    document.relations.push(Relation::WasDerivedFrom {
                        generated: file_id(*file),
                        used: file_id(*used),
                        activity: process_id(*process),
                        how: "write".into(),
                    });
                }
            }
            ProvRecord::Derived {
                file,
                from,
                process,
            } => document.relations.push(Relation::WasDerivedFrom {
                generated: file_id(*file),
                used: file_id(*from),
                activity: process_id(*process),
                how: "rename".into(),
            }),
            ProvRecord::Invalidated { file, process, .. } => {
                document.relations.push(Relation::WasInvalidatedBy {
                    entity: file_id(*file),
                    activity: process_id(*process),
                })
            }
        }
    }
    add_vm(&mut document, vm, &started);
    document
}

/// The VM as an activity: it used its inputs, generated its outputs and
/// started the command's first process.
fn add_vm(document: &mut Provenance, vm: &VmBoundary, started: &[u32]) {
    let roots: Vec<String> = document
        .activities
        .iter()
        .filter(|activity| {
            let id = activity
                .id
                .strip_prefix("process/")
                .and_then(|id| id.parse().ok());
            id.is_some_and(|id: u32| !started.contains(&id))
        })
        .map(|activity| activity.id.clone())
        .collect();
    document.activities.insert(
        0,
        Activity {
            id: VM_ACTIVITY.into(),
            exe: "provm run".into(),
            start_ns: vm.start_ns,
            end_ns: vm.end_ns,
            ..Activity::default()
        },
    );
    for root in roots {
        document.relations.push(Relation::WasStartedBy {
            activity: root.clone(),
            starter: VM_ACTIVITY.into(),
        });
        document.relations.push(Relation::WasInformedBy {
            informed: root,
            informant: VM_ACTIVITY.into(),
            how: "job".into(),
        });
    }
    let boundary = |item: &Boundary, kind| Entity {
        id: format!("vm/{}", item.name),
        kind,
        name: item.name.clone(),
        sha256: Some(item.sha256.clone()),
        size: item.size,
        content: item.content.clone(),
    };
    for input in &vm.inputs {
        document.entities.push(boundary(input, EntityKind::VmInput));
        document.relations.push(Relation::Used {
            activity: VM_ACTIVITY.into(),
            entity: format!("vm/{}", input.name),
            role: "input".into(),
        });
    }
    for output in &vm.outputs {
        document
            .entities
            .push(boundary(output, EntityKind::VmOutput));
        document.relations.push(Relation::WasGeneratedBy {
            entity: format!("vm/{}", output.name),
            activity: VM_ACTIVITY.into(),
        });
    }
}
