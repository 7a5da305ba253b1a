//! End-to-end provenance: one real guest runs several captured jobs; each
//! check builds the run's provenance from what the agent sent.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{images, one_guest_at_a_time, path, record_shell, shell_job};
use provm::provenance::{self, Direction, Format, Provenance, Relation, VmBoundary};
use provm_engine::replay::ReplayOptions;
use provm_engine::session::GuestSession;
use provm_engine::start::RunOptions;
use provm_guest_agent::Outcome;

use common::PROVM_FAILED;

const PIPELINE: &str = "sort in.txt > mid.txt; wc -l mid.txt > out.txt";

/// Runs `script` with capture on and returns its provenance.
fn captured(session: &mut GuestSession, options: &RunOptions, script: &str) -> Provenance {
    let job = provm_guest_agent::Job {
        provenance: true,
        ..shell_job(options, script)
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let outcome = session.run(job, &mut stdout, &mut stderr).unwrap();
    assert_eq!(
        outcome,
        Outcome::Exited(0),
        "{}",
        String::from_utf8_lossy(&stderr)
    );
    provenance::build(&session.take_provenance(), &VmBoundary::default())
}

/// Every relation but environment uses, with activities by label and
/// entities by name.
fn edges(document: &Provenance) -> BTreeSet<String> {
    let name = |id: &str| {
        document
            .activity(id)
            .map(|activity| activity.label())
            .or_else(|| document.entity(id).map(|entity| entity.name.clone()))
            .unwrap_or_else(|| panic!("{id} is not in the document"))
    };
    document
        .relations
        .iter()
        .filter_map(|relation| {
            let (from, to) = relation.ends();
            let (from, to) = (name(from), name(to));
            Some(match relation {
                Relation::Used { role, .. } if role == "environment" => return None,
                Relation::Used { role, .. } => format!("used({from}, {to}, {role})"),
                Relation::WasGeneratedBy { .. } => format!("wasGeneratedBy({from}, {to})"),
                Relation::WasInformedBy { how, .. } => {
                    format!("wasInformedBy({from}, {to}, {how})")
                }
                Relation::WasStartedBy { .. } => format!("wasStartedBy({from}, {to})"),
                Relation::WasDerivedFrom { how, .. } => {
                    format!("wasDerivedFrom({from}, {to}, {how})")
                }
                Relation::WasInvalidatedBy { .. } => format!("wasInvalidatedBy({from}, {to})"),
            })
        })
        .collect()
}

fn names(document: &Provenance) -> BTreeSet<String> {
    let activities = document.activities.iter().map(|activity| activity.label());
    let files = document
        .entities
        .iter()
        .filter(|entity| entity.kind == provenance::EntityKind::File)
        .map(|entity| entity.name.clone());
    activities.chain(files).collect()
}

#[test]
fn captured_jobs_have_exact_provenance() {
    let _guest = one_guest_at_a_time();
    let options = RunOptions {
        cwd: "/data".into(),
        timeout: Duration::from_secs(600),
        ..RunOptions::new(images().tiny_qcow2.clone(), Vec::new())
    };
    let prepared = provm_engine::start::prepare(&options).unwrap();
    let mut guest = common::start_guest(&options, &prepared);

    let pipeline = captured(&mut guest, &options, PIPELINE);
    let sh = format!("sh -c {PIPELINE}");
    let expected_names: BTreeSet<String> = [
        "provm run",
        &sh,
        "sort",
        "wc -l mid.txt",
        "/bin/busybox",
        "/data/in.txt",
        "/data/mid.txt",
        "/data/out.txt",
    ]
    .map(String::from)
    .into();
    assert_eq!(names(&pipeline), expected_names);
    let expected_edges: BTreeSet<String> = [
        format!("wasStartedBy({sh}, provm run)"),
        format!("wasInformedBy({sh}, provm run, job)"),
        format!("used({sh}, /bin/busybox, execute)"),
        format!("wasStartedBy(sort, {sh})"),
        format!("wasInformedBy(sort, {sh}, fork)"),
        "used(sort, /data/in.txt, read)".into(),
        "wasGeneratedBy(/data/mid.txt, sort)".into(),
        "wasDerivedFrom(/data/mid.txt, /data/in.txt, write)".into(),
        format!("wasStartedBy(wc -l mid.txt, {sh})"),
        format!("wasInformedBy(wc -l mid.txt, {sh}, exec)"),
        "used(wc -l mid.txt, /bin/busybox, execute)".into(),
        "used(wc -l mid.txt, /data/mid.txt, read)".into(),
        "wasGeneratedBy(/data/out.txt, wc -l mid.txt)".into(),
        "wasDerivedFrom(/data/out.txt, /data/mid.txt, write)".into(),
    ]
    .into();
    assert_eq!(edges(&pipeline), expected_edges);
    // The versions are the contents: in.txt as the image has it.
    let in_txt = pipeline
        .entities
        .iter()
        .find(|entity| entity.name == "/data/in.txt")
        .unwrap();
    assert_eq!(
        in_txt.sha256.as_deref(),
        Some(sha256("pear\napple\nfig\n").as_str())
    );
    check_prov_json(&pipeline);
    check_graph_command(&pipeline);

    // `; true`: the shell forks mv (run last, it would be the shell itself).
    let renamed = captured(
        &mut guest,
        &options,
        "sort in.txt > /tmp/t; mv /tmp/t /tmp/sorted; true",
    );
    let lineage = provenance::lineage(&renamed, "/tmp/sorted", Direction::Inputs).unwrap();
    assert!(edges(&lineage).contains("wasDerivedFrom(/tmp/sorted, /tmp/t, rename)"));
    let lineage = names(&lineage);
    for expected in ["/tmp/sorted", "/tmp/t", "/data/in.txt", "sort", "mv"] {
        assert!(lineage.contains(expected), "{expected} not in {lineage:?}");
    }

    let deleted = captured(
        &mut guest,
        &options,
        "echo scratch > /tmp/scratch; cat /tmp/scratch > /tmp/kept; rm /tmp/scratch",
    );
    let edges = edges(&deleted);
    assert!(
        edges
            .iter()
            .any(|edge| edge.starts_with("used(") && edge.contains("/tmp/scratch, read")),
        "{edges:?}"
    );
    assert!(
        edges
            .iter()
            .any(|edge| edge.starts_with("wasInvalidatedBy(/tmp/scratch,")),
        "{edges:?}"
    );
    let kept = provenance::lineage(&deleted, "/tmp/kept", Direction::Inputs).unwrap();
    assert!(names(&kept).contains("/tmp/scratch"));
    let affected = provenance::lineage(&deleted, "/tmp/scratch", Direction::Outputs).unwrap();
    assert!(names(&affected).contains("/tmp/kept"));
    guest.power_off().unwrap();
}

/// The graph derived at replay from the system calls is the in-guest
/// tracer's: one recording with `--prov` of the pipeline and of a rename
/// and a delete, both graphs of it compared edge by edge, and the file
/// digests the replay could compute compared with the tracer's.
#[test]
fn the_graph_derived_at_replay_is_the_in_guest_tracers() {
    let _guest = one_guest_at_a_time();
    let trace = common::trace_path(&common::scratch(module_path!()), "derived-provenance");
    let document = trace.with_extension("prov");
    let script =
        format!("{PIPELINE}; mv mid.txt /tmp/moved; cat /tmp/moved > kept.txt; rm /tmp/moved");
    let recorded = record_shell(
        &images().tiny_qcow2,
        &trace,
        &["--prov", path(&document), "--cwd", "/data", "--force"],
        &script,
    );
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);

    let traced = provenance::load(&trace).unwrap();
    let derived = provenance::load_or_derive(
        &ReplayOptions {
            trace: trace.clone(),
            image: None,
            timeout: Duration::from_secs(600),
            echo_console: false,
        },
        true,
    )
    .unwrap();
    assert_eq!(names(&derived), names(&traced));
    // The VM's own inputs and outputs differ: the derived graph names the
    // image, kernel and command (the trace's manifest), the tracer's also
    // the entropy, clock, stdout and stderr.
    let job_edges = |document: &Provenance| -> BTreeSet<String> {
        edges(document)
            .into_iter()
            .filter(|edge| {
                !edge.starts_with("used(provm run, ") && !edge.ends_with(", provm run)")
                    || edge.starts_with("wasStartedBy(")
            })
            .collect()
    };
    assert_eq!(job_edges(&derived), job_edges(&traced));
    for edge in [
        "wasDerivedFrom(/tmp/moved, /data/mid.txt, rename)",
        "wasInvalidatedBy(/data/mid.txt, mv)",
        "used(sort, /data/in.txt, read)",
    ] {
        assert!(
            edges(&derived).contains(edge),
            "{edge} not in {:#?}",
            edges(&derived)
        );
    }
    // Where the replay saw a file's whole content go by, its digest is the
    // tracer's: in.txt read whole, mid.txt and out.txt written from empty,
    // kept.txt a whole copy (busybox's cat copies with sendfile) of a
    // version whose digest it had.
    let digests = |document: &Provenance| -> BTreeSet<(String, String)> {
        document
            .entities
            .iter()
            .filter_map(|entity| Some((entity.name.clone(), entity.sha256.clone()?)))
            .filter(|(name, _)| name.starts_with("/data/") || name.starts_with("/tmp/"))
            .collect()
    };
    let (derived_digests, traced_digests) = (digests(&derived), digests(&traced));
    assert!(
        derived_digests.is_subset(&traced_digests),
        "{derived_digests:#?}\n{traced_digests:#?}"
    );
    for file in [
        "/data/in.txt",
        "/data/mid.txt",
        "/data/out.txt",
        "/data/kept.txt",
    ] {
        assert!(
            derived_digests.iter().any(|(name, _)| name == file),
            "no digest of {file}: {derived_digests:#?}"
        );
    }

    // The command line derives it when asked, or when the trace has none.
    let graph = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(["graph", "--from-replay", "--format", "dot", path(&trace)])
        .output()
        .unwrap();
    let dot = String::from_utf8_lossy(&graph.stdout);
    assert!(
        graph.status.success(),
        "{}",
        String::from_utf8_lossy(&graph.stderr)
    );
    assert!(
        dot.contains("/data/kept.txt") && dot.contains("rm /tmp/moved"),
        "{dot}"
    );
}

/// The PROV-JSON export passes the W3C PROV-JSON schema, formats included.
fn check_prov_json(document: &Provenance) {
    let path = provm_engine::kernel::cache_dir().join("prov-json.schema.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/install-deps fetches it)", path.display()));
    let schema: serde_json::Value = serde_json::from_str(&text).expect("the schema is JSON");
    let validator = jsonschema::draft4::options()
        .should_validate_formats(true)
        .build(&schema)
        .unwrap();
    let exported: serde_json::Value =
        serde_json::from_slice(&provenance::render(document, Format::ProvJson).unwrap()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&exported)
        .map(|error| format!("{error} at {}", error.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(exported["activity"].as_object().unwrap().len() >= 4);
}

/// `provm graph` on the stored document: SVG (kept in target-artifacts/ for
/// people), and clear refusals.
fn check_graph_command(document: &Provenance) {
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("target-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let stored = artifacts.join("pipeline.prov");
    provenance::save(document, &stored).unwrap();
    let graph = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_provm"))
            .arg("graph")
            .arg(&stored)
            .args(args)
            .output()
            .unwrap()
    };
    let svg = artifacts.join("pipeline.svg");
    let drawn = graph(&["--format", "svg", "--force", "-o", svg.to_str().unwrap()]);
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));

    let upstream = graph(&["--inputs-of", "/data/out.txt", "--format", "dot"]);
    let dot = String::from_utf8(upstream.stdout).unwrap();
    assert!(
        dot.contains("/data/in.txt") && dot.contains("sort"),
        "{dot}"
    );

    let untouched = graph(&["--outputs-of", "/data/never.txt"]);
    assert_eq!(untouched.status.code(), Some(PROVM_FAILED));
    let stderr = String::from_utf8_lossy(&untouched.stderr);
    assert!(stderr.contains("never touched /data/never.txt"), "{stderr}");

    let not_provenance = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(["graph", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")])
        .output()
        .unwrap();
    assert_eq!(not_provenance.status.code(), Some(PROVM_FAILED));
    let stderr = String::from_utf8_lossy(&not_provenance.stderr);
    assert!(stderr.contains("holds no provenance"), "{stderr}");
}

fn sha256(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}
