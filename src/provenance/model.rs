//! The provenance of one run, in W3C PROV-DM terms: activities (the
//! programs the command's processes ran, and the VM itself), entities
//! (versions of files, the VM's inputs and outputs) and the relations
//! between them. Serialised as JSON of its own; PROV-JSON and DOT are
//! exports (see prov_json.rs and dot.rs).

use serde::{Deserialize, Serialize};

/// The id of the activity that stands for the VM: it used the VM's inputs,
/// produced the console streams, and started the command.
pub const VM_ACTIVITY: &str = "vm";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    pub activities: Vec<Activity>,
    pub entities: Vec<Entity>,
    pub relations: Vec<Relation>,
}

/// A program run by one process (or the VM, [`VM_ACTIVITY`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    pub id: String,
    /// The guest's process id (0 for the VM).
    pub pid: u32,
    /// The executable, or for the VM a description.
    pub exe: String,
    pub argv: Vec<String>,
    /// Start and end in the guest's wall clock, nanoseconds since the epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    /// How it ended (`exit 0`, `signal 9`); none when it went on with exec.
    pub outcome: Option<String>,
}

impl Activity {
    /// A short name for people: the program's name as it was called (a
    /// multi-call binary such as busybox is its applet) and arguments.
    pub fn label(&self) -> String {
        let called = self.argv.first().unwrap_or(&self.exe);
        let name = called.rsplit('/').next().unwrap_or(called);
        let mut label = name.to_owned();
        for arg in self.argv.iter().skip(1) {
            label.push(' ');
            label.push_str(arg);
        }
        label
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntityKind {
    /// A version of a file in the guest.
    File,
    /// A process environment (its `KEY=VALUE` entries are in `content`).
    Environment,
    /// Something that crossed the VM's boundary: the disk image, the
    /// kernel, the command line, the console streams.
    VmInput,
    VmOutput,
}

/// The SHA-256 of nothing: every empty file and stream has it, so it links
/// no runs (`provm graph RUN...`, `export ro-crate RUN...`).
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// What separates the names of content several runs share (`provm graph
/// RUN...`): a file one run wrote at one path and another read at another.
pub const NAME_SEPARATOR: &str = " | ";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entity {
    pub id: String,
    pub kind: EntityKind,
    /// The file's path in the guest, or the input's name (`image`, ...).
    pub name: String,
    /// SHA-256, lowercase hex; none for content that was not read (devices,
    /// /proc files, directories).
    pub sha256: Option<String>,
    pub size: u64,
    /// Small textual content: an environment's entries, the command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub content: Vec<String>,
}

impl Entity {
    /// Its names: one, or one per path the runs sharing it gave it.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.name.split(NAME_SEPARATOR)
    }

    /// A version of the file at `path` with content `sha256`, for tests.
    #[cfg(test)]
    pub fn test_file(id: &str, path: &str, sha256: &str) -> Entity {
        Entity {
            id: id.into(),
            kind: EntityKind::File,
            name: path.into(),
            sha256: Some(sha256.into()),
            size: 1,
            content: Vec::new(),
        }
    }
}

/// The PROV relations provm records, by their PROV-DM names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "relation", rename_all = "camelCase")]
pub enum Relation {
    /// `role` is `read`, `execute` or `environment` (or `input` for the VM).
    Used {
        activity: String,
        entity: String,
        role: String,
    },
    WasGeneratedBy {
        entity: String,
        activity: String,
    },
    /// `informed` was started by `informant`, a fork or an exec (`how`).
    WasInformedBy {
        informed: String,
        informant: String,
        how: String,
    },
    WasStartedBy {
        activity: String,
        starter: String,
    },
    /// `generated` was made from `used`: written by a process that had read
    /// it (`how` = `write`), or renamed or linked from it (`rename`).
    WasDerivedFrom {
        generated: String,
        used: String,
        activity: String,
        how: String,
    },
    WasInvalidatedBy {
        entity: String,
        activity: String,
    },
}

impl Relation {
    /// The ids the relation connects, from its subject to its object.
    pub fn ends(&self) -> (&str, &str) {
        match self {
            Relation::Used {
                activity, entity, ..
            } => (activity, entity),
            Relation::WasGeneratedBy { entity, activity } => (entity, activity),
            Relation::WasInformedBy {
                informed,
                informant,
                ..
            } => (informed, informant),
            Relation::WasStartedBy { activity, starter } => (activity, starter),
            Relation::WasDerivedFrom {
                generated, used, ..
            } => (generated, used),
            Relation::WasInvalidatedBy { entity, activity } => (entity, activity),
        }
    }

    /// Whether data flows along the relation (from its object to its
    /// subject): what `--inputs-of` and `--outputs-of` follow.
    pub fn carries_data(&self) -> bool {
        matches!(
            self,
            Relation::Used { .. }
                | Relation::WasGeneratedBy { .. }
                | Relation::WasDerivedFrom { .. }
        )
    }
}

impl Provenance {
    /// Whether any process of the command was recorded (none when the
    /// command did not start).
    pub fn has_processes(&self) -> bool {
        self.activities
            .iter()
            .any(|activity| activity.id != VM_ACTIVITY)
    }

    pub fn activity(&self, id: &str) -> Option<&Activity> {
        self.activities.iter().find(|activity| activity.id == id)
    }

    pub fn entity(&self, id: &str) -> Option<&Entity> {
        self.entities.iter().find(|entity| entity.id == id)
    }

    /// The document with only the given nodes and the relations between them.
    pub fn restricted_to(&self, keep: &std::collections::HashSet<String>) -> Provenance {
        Provenance {
            activities: self
                .activities
                .iter()
                .filter(|activity| keep.contains(&activity.id))
                .cloned()
                .collect(),
            entities: self
                .entities
                .iter()
                .filter(|entity| keep.contains(&entity.id))
                .cloned()
                .collect(),
            relations: self
                .relations
                .iter()
                .filter(|relation| {
                    let (from, to) = relation.ends();
                    keep.contains(from) && keep.contains(to)
                })
                .cloned()
                .collect(),
        }
    }
}
