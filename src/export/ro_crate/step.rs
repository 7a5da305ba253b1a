//! One recorded run as a CreateAction and the entities it refers to: the
//! VM's inputs (the image and its backing files, the kernel, the
//! initramfs, the command line) and the guest files the command read as
//! its objects; the files it left written, its standard output and error
//! and the trace as its results; its environment. A Process Run Crate has
//! one (metadata.rs), a Workflow Run Crate one per step (workflow.rs).

use serde_json::{json, Value};

use provm_trace::manifest::{ContainerImage, ImageFile, Manifest, Outcome};

use super::super::makefile::shell_line;
use crate::provenance::{self, Entity, EntityKind, Provenance, EMPTY_SHA256};
use provm_engine::disk::chain;
use provm_engine::utc::Utc;

/// A file of the crate itself.
pub struct CrateFile {
    /// Its name in the crate's directory.
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// A recorded run, as its trace and provenance tell it.
pub struct Step<'a> {
    pub manifest: &'a Manifest,
    pub outcome: &'a Outcome,
    pub graph: &'a Provenance,
    /// The trace, copied into the crate.
    pub trace: &'a CrateFile,
    /// Whether the trace holds the image too.
    pub embeds_image: bool,
}

/// How the entities of a step are identified.
pub enum Naming {
    /// The crate's only run: by role (`#image`, `#guest-file/3`).
    OnlyRun,
    /// Step N of several: content by its digest (`#sha256-...`), so that
    /// what one step left written and another read is one entity; the
    /// rest (and empty content) under `#step-N/`.
    Step(usize),
}

impl Naming {
    /// The id of the entity called `local` (`#image`) in a crate of one
    /// run, whose content has `sha256` if known.
    pub fn id(&self, local: &str, sha256: Option<&str>) -> String {
        match (self, sha256.filter(|digest| *digest != EMPTY_SHA256)) {
            (Naming::OnlyRun, _) => local.to_owned(),
            (Naming::Step(_), Some(sha256)) => format!("#sha256-{sha256}"),
            (Naming::Step(step), None) => {
                format!("#step-{step}/{}", local.trim_start_matches('#'))
            }
        }
    }
}

/// The step's CreateAction (`id`, run with `instrument`) and the entities
/// it refers to.
pub fn action(step: &Step, naming: &Naming, id: &str, instrument: &str) -> (Value, Vec<Value>) {
    let (manifest, outcome) = (step.manifest, step.outcome);
    let command = shell_line(&manifest.argv);
    let (objects, object_entities) = objects(step, naming);
    let (results, result_entities) = results(step, naming);
    let environment = environment(manifest, naming);
    let ended = manifest.started_unix + outcome.host_seconds.ceil() as u64;
    let mut action = json!({
        "@id": id,
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
        "instrument": { "@id": instrument },
        "object": objects,
        "result": results,
        "environment": references(&environment),
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
    let mut entities = object_entities;
    entities.extend(result_entities);
    entities.extend(environment);
    (action, entities)
}

/// The command's environment variables.
fn environment(manifest: &Manifest, naming: &Naming) -> Vec<Value> {
    manifest
        .env
        .iter()
        .map(|entry| {
            let (name, value) = entry.split_once('=').unwrap_or((entry, ""));
            json!({
                "@id": naming.id(&format!("#environment/{name}"), None),
                "@type": "PropertyValue",
                "name": name,
                "value": value,
            })
        })
        .collect()
}

/// The action's inputs: the VM's (the image's files, the kernel, the
/// initramfs, the command line), then the guest files the command read and
/// did not write; references and entities.
fn objects(step: &Step, naming: &Naming) -> (Vec<Value>, Vec<Value>) {
    let manifest = step.manifest;
    let mut entities: Vec<Value> = manifest
        .image
        .chain
        .iter()
        .map(|file| image_file(file, naming))
        .collect();
    entities.extend(
        manifest
            .image
            .container
            .as_ref()
            .map(|container| container_image(container, naming)),
    );
    entities.extend([
        json!({
            "@id": naming.id("#kernel", Some(&manifest.kernel_sha256)),
            "@type": "File",
            "name": "the guest kernel",
            "description": "The Linux kernel the guest booted; the trace embeds it (`provm replay --extract-kernel`).",
            "sha256": manifest.kernel_sha256,
        }),
        json!({
            "@id": naming.id("#initramfs", Some(&manifest.initramfs_sha256)),
            "@type": "File",
            "name": "the guest agent's initramfs",
            "description": "provm's guest agent, PID 1 of the guest, which runs the command; the trace embeds it.",
            "sha256": manifest.initramfs_sha256,
        }),
        json!({
            "@id": naming.id("#command", None),
            "@type": "PropertyValue",
            "name": "command",
            "value": shell_line(&manifest.argv),
        }),
    ]);
    entities.extend(
        provenance::input_files(step.graph)
            .into_iter()
            .map(|file| guest_file(file, "read by the command", naming)),
    );
    (references(&entities), entities)
}

/// The action's outputs: the guest files the command left written, its
/// standard output and error, and the trace; references and entities.
fn results(step: &Step, naming: &Naming) -> (Vec<Value>, Vec<Value>) {
    let mut entities: Vec<Value> = provenance::output_files(step.graph)
        .values()
        .map(|output| guest_file(output.version, "left written by the command", naming))
        .collect();
    entities.extend(
        step.graph
            .entities
            .iter()
            .filter(|entity| entity.kind == EntityKind::VmOutput)
            .map(|stream| {
                with_digest(
                    json!({
                        "@id": naming.id(&format!("#{}", stream.name), stream.sha256.as_deref()),
                        "@type": "File",
                        "name": format!("the command's {}", stream.name),
                        "description": "Streamed to the host while the command ran; not in this crate (a replay checks every byte of it).",
                    }),
                    stream,
                )
            }),
    );
    let mut references = references(&entities);
    references.push(json!({ "@id": step.trace.name }));
    let trace = json!({
        "@id": step.trace.name,
        "@type": "File",
        "name": "the provm trace of the run",
        "description": "Everything the guest received, as logged at the VM boundary, with the kernel, initramfs and snapshot it started from: `provm inspect` verifies it, `provm replay` re-executes it.",
        "encodingFormat": "application/octet-stream",
        "contentSize": step.trace.size.to_string(),
        "sha256": step.trace.sha256,
    });
    entities.push(trace);
    (references, entities)
}

/// One file of the image's chain, named by file name and digest.
fn image_file(file: &ImageFile, naming: &Naming) -> Value {
    let role = format!("#{}", chain::role_name(file));
    json!({
        "@id": naming.id(&role, Some(&file.sha256)),
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
fn container_image(container: &ContainerImage, naming: &Naming) -> Value {
    json!({
        "@id": naming.id("#container-image", None),
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
fn guest_file(file: &Entity, how: &str, naming: &Naming) -> Value {
    with_digest(
        json!({
            "@id": naming.id(&format!("#guest-{}", file.id), file.sha256.as_deref()),
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

/// A reference to each of `entities`.
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
    fn a_step_names_content_by_digest_and_the_rest_under_its_number() {
        let only = Naming::OnlyRun;
        assert_eq!(only.id("#guest-file/3", Some("ab12")), "#guest-file/3");
        let step = Naming::Step(2);
        assert_eq!(step.id("#guest-file/3", Some("ab12")), "#sha256-ab12");
        assert_eq!(step.id("#guest-file/3", None), "#step-2/guest-file/3");
        assert_eq!(step.id("#command", None), "#step-2/command");
        assert_eq!(step.id("#stdout", Some(EMPTY_SHA256)), "#step-2/stdout");
    }
}
