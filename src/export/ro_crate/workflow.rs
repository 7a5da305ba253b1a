//! The ro-crate-metadata.json of several runs (`provm export ro-crate
//! RUN...`): a Provenance Run Crate, the richest of the Workflow Run Crate
//! profiles. The runs are the steps of a workflow, the script that replays
//! them in order (`workflow.sh`, the crate's main entity); each step is a
//! CreateAction of its own (step.rs) whose instrument is the step's tool,
//! the command it ran, with its files identified by SHA-256: a file one
//! step left written and a later one read is one entity, the result of
//! the one and an object of the other. A ControlAction per step ties its
//! HowToStep to its CreateAction; provm's OrganizeAction ran them all and
//! resulted in the workflow's CreateAction.

use std::collections::{BTreeSet, HashMap};

use serde_json::{json, Value};

use super::super::makefile::shell_line;
use super::metadata::{self, About, ACTION, PROCESS_RUN_CRATE, PROVM};
use super::step::{self, Naming, Step};
use provm_engine::utc::Utc;

/// The profiles the crate conforms to: Provenance Run Crate and those it
/// extends, newest versions roc-validator knows.
const PROFILES: [(&str, &str); 4] = [
    (PROCESS_RUN_CRATE, "Process Run Crate"),
    (
        "https://w3id.org/ro/wfrun/workflow/0.5",
        "Workflow Run Crate",
    ),
    (
        "https://w3id.org/ro/wfrun/provenance/0.5",
        "Provenance Run Crate",
    ),
    (
        "https://w3id.org/workflowhub/workflow-ro-crate/1.0",
        "Workflow RO-Crate",
    ),
];
const SHELL: &str = "#shell";
/// The Bioschemas profile a workflow entity follows.
const BIOSCHEMAS_WORKFLOW: &str =
    "https://bioschemas.org/profiles/ComputationalWorkflow/1.0-RELEASE";
const ORGANIZE: &str = "#organize";

/// The metadata of a crate of `steps`, in the order they ran, whose
/// workflow is the script `workflow` (see [`script`]).
pub fn metadata(steps: &[Step], workflow: &str, about: &About) -> Value {
    let commands: Vec<String> = steps
        .iter()
        .map(|step| shell_line(&step.manifest.argv))
        .collect();
    let provm_version = &steps[0].manifest.provm_version;
    let mut actions = Vec::new();
    let mut entities = Vec::new();
    let (mut objects, mut results) = (Vec::new(), Vec::new());
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        let ids = StepIds::new(number);
        let (action, step_entities) =
            step::action(step, &Naming::Step(number), &ids.run, &ids.tool);
        objects.extend(action["object"].as_array().cloned().unwrap_or_default());
        results.extend(action["result"].as_array().cloned().unwrap_or_default());
        actions.extend([
            json!({
                "@id": ids.tool,
                "@type": "SoftwareApplication",
                "name": commands[index],
                "description": format!("The command of step {number}, run in a whole Linux VM by provm {}.", step.manifest.provm_version),
            }),
            json!({
                "@id": ids.step,
                "@type": "HowToStep",
                "name": format!("step {number}: {}", commands[index]),
                "position": number,
                "workExample": { "@id": ids.tool },
            }),
            json!({
                "@id": ids.control,
                "@type": "ControlAction",
                "name": format!("orchestrate step {number}"),
                "instrument": { "@id": ids.step },
                "object": { "@id": ids.run },
            }),
            action,
        ]);
        entities.extend(step_entities);
    }
    let made: BTreeSet<String> = results.iter().map(id_of).collect();
    let inputs: Vec<Value> = distinct(
        objects
            .into_iter()
            .filter(|object| !made.contains(&id_of(object))),
    );
    let ids: Vec<StepIds> = (1..=steps.len()).map(StepIds::new).collect();
    let first = steps[0].manifest;
    let last = &steps[steps.len() - 1];
    let ended = last.manifest.started_unix + last.outcome.host_seconds.ceil() as u64;
    let complete = steps.iter().all(|step| step.outcome.complete);
    let parts: Vec<Value> = std::iter::once(workflow)
        .chain(steps.iter().map(|step| step.trace.name.as_str()))
        .chain([about.readme])
        .map(|part| json!({ "@id": part }))
        .collect();
    let root = json!({
        "@id": "./",
        "@type": "Dataset",
        "name": format!("provm runs of {}", commands.join("; ")),
        "description": format!(
            "The traces of {} runs, each of a command inside a whole Linux VM recorded by provm, as the steps of a workflow: what one step left written and a later one read is one file, identified by its SHA-256. {} tells how to check them.",
            steps.len(),
            about.readme
        ),
        "conformsTo": PROFILES.map(|(profile, _)| json!({ "@id": profile })),
        "hasPart": parts,
        "mainEntity": { "@id": workflow },
        "mentions": std::iter::once(ACTION)
            .chain(ids.iter().map(|ids| ids.run.as_str()))
            .map(|action| json!({ "@id": action }))
            .collect::<Vec<_>>(),
    });
    let profiles = PROFILES.map(|(id, name)| metadata::profile(id, name));
    let mut graph = metadata::about(about, root, &profiles, provm_version);
    graph.extend([
        json!({
            "@id": workflow,
            "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"],
            "name": "the runs, in the order they ran",
            "description": "A shell script that replays each step's trace in order with provm, which checks that each is the recorded run.",
            "encodingFormat": "text/x-shellscript",
            "conformsTo": { "@id": BIOSCHEMAS_WORKFLOW },
            "programmingLanguage": { "@id": SHELL },
            "hasPart": ids.iter().map(|ids| json!({ "@id": ids.tool })).collect::<Vec<_>>(),
            "step": ids.iter().map(|ids| json!({ "@id": ids.step })).collect::<Vec<_>>(),
        }),
        json!({
            "@id": SHELL,
            "@type": "ComputerLanguage",
            "name": "POSIX shell",
            "alternateName": "sh",
            "url": { "@id": "https://pubs.opengroup.org/onlinepubs/9799919799/utilities/V3_chap02.html" },
        }),
        json!({
            "@id": ORGANIZE,
            "@type": "OrganizeAction",
            "name": "provm, recording each step",
            "instrument": { "@id": PROVM },
            "object": ids.iter().map(|ids| json!({ "@id": ids.control })).collect::<Vec<_>>(),
            "result": { "@id": ACTION },
        }),
        json!({
            "@id": ACTION,
            "@type": "CreateAction",
            "name": format!("the {} runs", steps.len()),
            "description": format!("The steps run one after the other, each recorded by provm: {}.", commands.join("; then ")),
            "instrument": { "@id": workflow },
            "object": inputs,
            "result": distinct(results.into_iter()),
            "startTime": Utc::from_unix_seconds(first.started_unix).iso_8601(),
            "endTime": Utc::from_unix_seconds(ended).iso_8601(),
            "actionStatus": if complete {
                "http://schema.org/CompletedActionStatus"
            } else {
                "http://schema.org/FailedActionStatus"
            },
        }),
    ]);
    graph.extend(actions);
    graph.extend(merged(entities));
    // RO-Crate 1.1's context has Bioschemas' old term, which the Workflow
    // RO-Crate profile (and its validator) no longer take.
    metadata::document(
        graph,
        &[(
            "ComputationalWorkflow",
            "https://bioschemas.org/ComputationalWorkflow",
        )],
    )
}

/// The script that is the crate's workflow: each step's command as a
/// comment and the replay of its trace.
pub fn script(steps: &[Step]) -> String {
    let mut script = String::from(
        "#!/bin/sh\n# The runs of this crate, in the order they ran, each a command recorded\n\
         # by provm in a whole Linux VM. Replaying a trace checks that it is the run\n\
         # (see README.md); provm finds each image by its recorded name.\nset -e\n",
    );
    for (index, step) in steps.iter().enumerate() {
        let command = shell_line(&step.manifest.argv).replace('\n', " ");
        script.push_str(&format!(
            "\n# step {}: {command}\nprovm replay {}\n",
            index + 1,
            shell_line(std::slice::from_ref(&step.trace.name))
        ));
    }
    script
}

/// The ids of step N's entities.
struct StepIds {
    step: String,
    tool: String,
    control: String,
    run: String,
}

impl StepIds {
    fn new(number: usize) -> StepIds {
        let step = format!("#step-{number}");
        StepIds {
            tool: format!("{step}/tool"),
            control: format!("{step}/control"),
            run: format!("{step}/run"),
            step,
        }
    }
}

fn id_of(reference: &Value) -> String {
    reference["@id"].as_str().unwrap_or_default().to_owned()
}

/// `references` without repeats, in first-seen order.
fn distinct(references: impl Iterator<Item = Value>) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    references
        .filter(|reference| seen.insert(id_of(reference)))
        .collect()
}

/// One entity per id: content the steps share (by digest) appears once,
/// with the other names the steps gave it as alternateName and a
/// description that fits every step.
fn merged(entities: Vec<Value>) -> Vec<Value> {
    let mut merged: Vec<Value> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for entity in entities {
        let id = id_of(&entity);
        let Some(&index) = at.get(&id) else {
            at.insert(id, merged.len());
            merged.push(entity);
            continue;
        };
        let kept = &mut merged[index];
        if kept["description"] != entity["description"] {
            kept["description"] = json!("Content several steps used or made (see their actions' object and result), identified by its SHA-256; not in this crate.");
        }
        if kept["name"] != entity["name"] {
            let mut names: Vec<Value> = match kept["alternateName"].take() {
                Value::Array(names) => names,
                Value::Null => Vec::new(),
                name => vec![name],
            };
            if !names.contains(&entity["name"]) {
                names.push(entity["name"].clone());
            }
            // One name as a value, not a list of one (RO-Crate's advice).
            kept["alternateName"] = match names.len() {
                1 => names.remove(0),
                _ => json!(names),
            };
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_content_is_one_entity_with_the_other_names() {
        let file = |name: &str, description: &str| json!({ "@id": "#sha256-ab", "@type": "File", "name": name, "description": description });
        let entities = vec![
            file("/tmp/out.txt", "left written"),
            json!({ "@id": "#step-2/command", "name": "command" }),
            file("/data/in.txt", "read"),
            file("/data/in.txt", "read"),
        ];
        let merged = merged(entities);
        assert_eq!(merged.len(), 2, "{merged:#?}");
        assert_eq!(merged[0]["name"], "/tmp/out.txt");
        assert_eq!(merged[0]["alternateName"], "/data/in.txt");
        assert!(merged[0]["description"]
            .as_str()
            .unwrap()
            .contains("several steps"));
    }
}
