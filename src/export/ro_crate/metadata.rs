//! The crate's ro-crate-metadata.json: a Process Run Crate, the JSON-LD
//! graph of one CreateAction (the recorded command) whose instrument is
//! provm, whose objects are the VM's inputs (the image and its backing
//! files, the kernel, the initramfs, the command line) and the guest files
//! the command read, and whose results are the files it left written, its
//! standard output and error, and the trace itself.

use serde_json::{json, Value};

use provm_trace::manifest::{ContainerImage, ImageFile, Manifest, Outcome};

use super::super::makefile::shell_line;
use crate::provenance::{self, Entity, EntityKind, Provenance};
use provm_engine::disk::chain;
use provm_engine::utc::date_time as utc_date_time;
use provm_engine::utc::Utc;

/// The RO-Crate version the crate conforms to, and its JSON-LD context.
const RO_CRATE: &str = "https://w3id.org/ro/crate/1.1";
const RO_CRATE_CONTEXT: &str = "https://w3id.org/ro/crate/1.1/context";
/// The newest Process Run Crate version roc-validator knows.
const PROCESS_RUN_CRATE: &str = "https://w3id.org/ro/wfrun/process/0.5";
/// Workflow Run Crate's own terms (`environment`).
const WFRUN_TERMS: &str = "https://w3id.org/ro/terms/workflow-run#";
const ACTION: &str = "#run";
const PROVM: &str = "#provm";

/// A file of the crate itself.
pub struct CrateFile {
    /// Its name in the crate's directory.
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// The license the crate is published under.
pub enum License {
    /// An SPDX identifier (`CC-BY-4.0`) or a URL.
    Chosen(String),
    /// None yet: the crate says so instead of choosing for its author.
    Unchosen,
}

/// What the metadata describes.
pub struct Run<'a> {
    pub manifest: &'a Manifest,
    pub outcome: &'a Outcome,
    pub graph: &'a Provenance,
    pub trace: &'a CrateFile,
    pub readme: &'a str,
    pub license: &'a License,
    /// When the crate was made, seconds since the Unix epoch.
    pub published_unix: u64,
}

/// The ro-crate-metadata.json of `run`.
pub fn metadata(run: &Run) -> Value {
    let manifest = run.manifest;
    let command = shell_line(&manifest.argv);
    let (license_id, license) = license(run.license);
    let (objects, object_entities) = objects(run);
    let (results, result_entities) = results(run);
    let environment: Vec<Value> = manifest
        .env
        .iter()
        .map(|entry| {
            let (name, value) = entry.split_once('=').unwrap_or((entry, ""));
            json!({
                "@id": format!("#environment/{name}"),
                "@type": "PropertyValue",
                "name": name,
                "value": value,
            })
        })
        .collect();
    let mut graph = vec![
        json!({
            "@id": "ro-crate-metadata.json",
            "@type": "CreativeWork",
            "conformsTo": { "@id": RO_CRATE },
            "about": { "@id": "./" },
        }),
        json!({
            "@id": "./",
            "@type": "Dataset",
            "name": format!("provm run of {command}"),
            "description": format!(
                "The trace of one run of `{command}` inside a whole Linux VM, recorded by provm {} on {}: it replays exactly (`provm replay`). {} tells how to check it.",
                manifest.provm_version,
                utc_date_time(manifest.started_unix),
                run.readme
            ),
            "datePublished": Utc::from_unix_seconds(run.published_unix).iso_8601(),
            "license": { "@id": license_id },
            "conformsTo": { "@id": PROCESS_RUN_CRATE },
            "hasPart": [{ "@id": run.trace.name }, { "@id": run.readme }],
            "mentions": { "@id": ACTION },
        }),
        json!({
            "@id": PROCESS_RUN_CRATE,
            "@type": "CreativeWork",
            "name": "Process Run Crate",
            "version": "0.5",
        }),
        license,
        json!({
            "@id": run.readme,
            "@type": "File",
            "name": "How to check this crate",
            "encodingFormat": "text/markdown",
            "about": { "@id": "./" },
        }),
        json!({
            "@id": PROVM,
            "@type": "SoftwareApplication",
            "name": "provm",
            "version": manifest.provm_version,
            "description": "Records a command's whole Linux virtual machine at the VMM boundary, so that the run replays exactly",
        }),
        action(run, &command, objects, results, &environment),
    ];
    graph.extend(object_entities);
    graph.extend(result_entities);
    graph.extend(environment);
    json!({
        "@context": [
            RO_CRATE_CONTEXT,
            {
                // schema.org's, which RO-Crate 1.1's context predates.
                "sha256": "http://schema.org/sha256",
                "environment": format!("{WFRUN_TERMS}environment"),
            },
        ],
        "@graph": graph,
    })
}

/// The CreateAction: the command provm ran and recorded.
fn action(
    run: &Run,
    command: &str,
    objects: Vec<Value>,
    results: Vec<Value>,
    environment: &[Value],
) -> Value {
    let (manifest, outcome) = (run.manifest, run.outcome);
    let ended = manifest.started_unix + outcome.host_seconds.ceil() as u64;
    let mut action = json!({
        "@id": ACTION,
        "@type": "CreateAction",
        "name": format!("provm record: {command}"),
        "description": format!(
            "`{command}` run in the guest's {} (working directory {}), {}; {}",
            manifest.root_device,
            manifest.cwd,
            match outcome.exit_status {
                Some(status) => format!("exit status {status}"),
                None => "no exit status".into(),
            },
            outcome.ended
        ),
        "instrument": { "@id": PROVM },
        "object": objects,
        "result": results,
        "environment": environment
            .iter()
            .map(|variable| json!({ "@id": variable["@id"] }))
            .collect::<Vec<_>>(),
        "startTime": Utc::from_unix_seconds(manifest.started_unix).iso_8601(),
        "endTime": Utc::from_unix_seconds(ended).iso_8601(),
    });
    // A plain IRI string, as the profile's examples and its check have it.
    if outcome.complete {
        action["actionStatus"] = json!("http://schema.org/CompletedActionStatus");
    } else {
        action["actionStatus"] = json!("http://schema.org/FailedActionStatus");
        action["error"] = json!(outcome.ended);
    }
    action
}

/// The license's id and entity.
fn license(license: &License) -> (String, Value) {
    match license {
        License::Chosen(chosen) => {
            let id = if chosen.contains("://") {
                chosen.clone()
            } else {
                format!("https://spdx.org/licenses/{chosen}")
            };
            let entity = json!({ "@id": id, "@type": "CreativeWork", "name": chosen });
            (id, entity)
        }
        License::Unchosen => (
            "#license".into(),
            json!({
                "@id": "#license",
                "@type": "CreativeWork",
                "name": "no license chosen",
                "description": "The author exported this crate without choosing a license (`provm export ro-crate --license ID` sets one): ask them before reusing it.",
            }),
        ),
    }
}

/// The action's inputs: the VM's (the image's files, the kernel, the
/// initramfs, the command line), then the guest files the command read and
/// did not write; references and entities.
fn objects(run: &Run) -> (Vec<Value>, Vec<Value>) {
    let manifest = run.manifest;
    let mut entities: Vec<Value> = manifest.image.chain.iter().map(image_file).collect();
    entities.extend(manifest.image.container.as_ref().map(container_image));
    entities.extend([
        json!({
            "@id": "#kernel",
            "@type": "File",
            "name": "the guest kernel",
            "description": "The Linux kernel the guest booted; the trace embeds it (`provm replay --extract-kernel`).",
            "sha256": manifest.kernel_sha256,
        }),
        json!({
            "@id": "#initramfs",
            "@type": "File",
            "name": "the guest agent's initramfs",
            "description": "provm's guest agent, PID 1 of the guest, which runs the command; the trace embeds it.",
            "sha256": manifest.initramfs_sha256,
        }),
        json!({
            "@id": "#command",
            "@type": "PropertyValue",
            "name": "command",
            "value": shell_line(&manifest.argv),
        }),
    ]);
    entities.extend(
        provenance::input_files(run.graph)
            .into_iter()
            .map(|file| guest_file(file, "read by the command")),
    );
    (references(&entities), entities)
}

/// The action's outputs: the guest files the command left written, its
/// standard output and error, and the trace; references and entities.
fn results(run: &Run) -> (Vec<Value>, Vec<Value>) {
    let mut entities: Vec<Value> = provenance::output_files(run.graph)
        .values()
        .map(|output| guest_file(output.version, "left written by the command"))
        .collect();
    entities.extend(
        run.graph
            .entities
            .iter()
            .filter(|entity| entity.kind == EntityKind::VmOutput)
            .map(|stream| {
                with_digest(
                    json!({
                        "@id": format!("#{}", stream.name),
                        "@type": "File",
                        "name": format!("the command's {}", stream.name),
                        "description": "Streamed to the host while the command ran; not in this crate (a replay checks every byte of it).",
                    }),
                    stream,
                )
            }),
    );
    let mut references = references(&entities);
    references.push(json!({ "@id": run.trace.name }));
    let trace = json!({
        "@id": run.trace.name,
        "@type": "File",
        "name": "the provm trace of the run",
        "description": "Everything the guest received, as logged at the VM boundary, with the kernel, initramfs and snapshot it started from: `provm inspect` verifies it, `provm replay` re-executes it.",
        "encodingFormat": "application/octet-stream",
        "contentSize": run.trace.size.to_string(),
        "sha256": run.trace.sha256,
    });
    entities.push(trace);
    (references, entities)
}

/// One file of the image's chain, named by file name and digest.
fn image_file(file: &ImageFile) -> Value {
    json!({
        "@id": format!("#{}", chain::role_name(file)),
        "@type": "File",
        "name": file.path,
        "description": format!(
            "{} of the guest's disk, not in this crate: `provm replay --image` takes it, checked by its digest.",
            capitalised(&chain::describe(file))
        ),
        "contentSize": file.size.to_string(),
        "sha256": file.sha256,
    })
}

/// The container image the guest's disk was made of, named by its digest.
fn container_image(container: &ContainerImage) -> Value {
    json!({
        "@id": "#container-image",
        "@type": "SoftwareApplication",
        "name": container.reference,
        "identifier": container.digest,
        "description": format!(
            "The container image the guest's disk was made of (its {} digest is the identifier), not in this crate: the same image makes the same disk, which `provm replay --image {}` checks by its digest.",
            container.digest_of, container.reference
        ),
    })
}

/// A version of a file in the guest.
fn guest_file(file: &Entity, how: &str) -> Value {
    with_digest(
        json!({
            "@id": format!("#guest-{}", file.id),
            "@type": "File",
            "name": file.name,
            "description": format!("A file in the guest, {how}; its content is in the image or the replay, not in this crate."),
        }),
        file,
    )
}

/// `value` with the entity's size and digest, where it has one.
fn with_digest(mut value: Value, entity: &Entity) -> Value {
    if let Some(sha256) = &entity.sha256 {
        value["sha256"] = json!(sha256);
        value["contentSize"] = json!(entity.size.to_string());
    }
    value
}

fn references(entities: &[Value]) -> Vec<Value> {
    entities
        .iter()
        .map(|entity| json!({ "@id": entity["@id"] }))
        .collect()
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_license_is_an_spdx_identifier_or_a_url_and_none_is_said() {
        let (id, entity) = license(&License::Chosen("CC-BY-4.0".into()));
        assert_eq!(id, "https://spdx.org/licenses/CC-BY-4.0");
        assert_eq!(entity["name"], "CC-BY-4.0");
        let url = "https://example.org/terms";
        assert_eq!(license(&License::Chosen(url.into())).0, url);
        let (id, entity) = license(&License::Unchosen);
        assert_eq!(entity["@id"], id);
        assert!(entity["description"]
            .as_str()
            .unwrap()
            .contains("--license"));
    }
}
