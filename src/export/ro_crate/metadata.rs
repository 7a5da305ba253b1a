//! The crate's ro-crate-metadata.json for one run: a Process Run Crate,
//! the JSON-LD graph of one CreateAction (the recorded command, see
//! step.rs) whose instrument is provm; and the entities every crate of
//! provm's has (workflow.rs makes the crate of several runs).

use serde_json::{json, Value};

use super::super::makefile::shell_line;
use super::step::{self, Naming, Step};
use provm_engine::utc::date_time as utc_date_time;
use provm_engine::utc::Utc;

/// The RO-Crate version the crate conforms to, and its JSON-LD context.
const RO_CRATE: &str = "https://w3id.org/ro/crate/1.1";
const RO_CRATE_CONTEXT: &str = "https://w3id.org/ro/crate/1.1/context";
/// The newest Process Run Crate version roc-validator knows.
pub const PROCESS_RUN_CRATE: &str = "https://w3id.org/ro/wfrun/process/0.5";
/// Workflow Run Crate's own terms (`environment`).
const WFRUN_TERMS: &str = "https://w3id.org/ro/terms/workflow-run#";
/// The action that is the run (of the command, or of the workflow).
pub const ACTION: &str = "#run";
pub const PROVM: &str = "#provm";

/// The license the crate is published under.
pub enum License {
    /// An SPDX identifier (`CC-BY-4.0`) or a URL.
    Chosen(String),
    /// None yet: the crate says so instead of choosing for its author.
    Unchosen,
}

/// What the metadata describes.
pub struct Run<'a> {
    pub step: &'a Step<'a>,
    pub about: &'a About<'a>,
}

/// What a crate says of itself.
pub struct About<'a> {
    /// The README's name in the crate.
    pub readme: &'a str,
    pub license: &'a License,
    /// When the crate was made, seconds since the Unix epoch.
    pub published_unix: u64,
}

/// The ro-crate-metadata.json of `run`.
pub fn metadata(run: &Run) -> Value {
    let manifest = run.step.manifest;
    let command = shell_line(&manifest.argv);
    let (action, entities) = step::action(run.step, &Naming::OnlyRun, ACTION, PROVM);
    let root = json!({
        "@id": "./",
        "@type": "Dataset",
        "name": format!("provm run of {command}"),
        "description": format!(
            "The trace of one run of `{command}` inside a whole Linux VM, recorded by provm {} on {}: it replays exactly (`provm replay`). {} tells how to check it.",
            manifest.provm_version,
            utc_date_time(manifest.started_unix),
            run.about.readme
        ),
        "conformsTo": { "@id": PROCESS_RUN_CRATE },
        "hasPart": [{ "@id": run.step.trace.name }, { "@id": run.about.readme }],
        "mentions": { "@id": ACTION },
    });
    let profiles = [profile(PROCESS_RUN_CRATE, "Process Run Crate")];
    let mut graph = about(run.about, root, &profiles, &manifest.provm_version);
    graph.push(action);
    graph.extend(entities);
    document(graph, &[])
}

/// The profile `id` (a versioned permalink), called `name`.
pub fn profile(id: &str, name: &str) -> Value {
    let version = id.rsplit('/').next().unwrap_or_default();
    json!({ "@id": id, "@type": "CreativeWork", "name": name, "version": version })
}

/// The metadata descriptor, `root` (a Dataset) with its license and date,
/// the `profiles` it conforms to, the license, the README and provm: what
/// every crate holds.
pub fn about(
    about: &About,
    mut root: Value,
    profiles: &[Value],
    provm_version: &str,
) -> Vec<Value> {
    let (license_id, license) = license(about.license);
    root["datePublished"] = json!(Utc::from_unix_seconds(about.published_unix).iso_8601());
    root["license"] = json!({ "@id": license_id });
    let mut graph = vec![
        json!({
            "@id": "ro-crate-metadata.json",
            "@type": "CreativeWork",
            "conformsTo": { "@id": RO_CRATE },
            "about": { "@id": "./" },
        }),
        root,
    ];
    graph.extend_from_slice(profiles);
    graph.extend([
        license,
        json!({
            "@id": about.readme,
            "@type": "File",
            "name": "How to check this crate",
            "encodingFormat": "text/markdown",
            "about": { "@id": "./" },
        }),
        json!({
            "@id": PROVM,
            "@type": "SoftwareApplication",
            "name": "provm",
            "version": provm_version,
            "description": "Records a command's whole Linux virtual machine at the VMM boundary, so that the run replays exactly",
        }),
    ]);
    graph
}

/// The JSON-LD document of the entities `graph`, with `terms` defined
/// beyond RO-Crate 1.1's context.
pub fn document(graph: Vec<Value>, terms: &[(&str, &str)]) -> Value {
    let mut context = json!({
        // schema.org's, which RO-Crate 1.1's context predates.
        "sha256": "http://schema.org/sha256",
        "environment": format!("{WFRUN_TERMS}environment"),
    });
    for (term, iri) in terms {
        context[*term] = json!(iri);
    }
    json!({
        "@context": [RO_CRATE_CONTEXT, context],
        "@graph": graph,
    })
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
