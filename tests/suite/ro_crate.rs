//! `provm export ro-crate`: the crate of a real recorded run is a valid
//! Process Run Crate under roc-validator and loads with ro-crate-py
//! (`scripts/check-ro-crate`, which installs both from PyPI into provm's
//! cache on first use), and the same crate without the profile's
//! conformsTo is refused by the validator. Two runs, the second reading
//! what the first wrote, make a valid Provenance Run Crate in which that
//! file is one entity; `provm graph` draws it as one node and `provm
//! query` names the run that depends on it. The three-step workflow of
//! docs/examples/workflow, run by make, deposits one valid crate in which
//! each step reads, by digest, what the step before it wrote.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{digest, images, one_guest_at_a_time, path, provm, record_shell, PROVM_FAILED};
use serde_json::Value;

const SCRIPT: &str = "sort /data/in.txt > /tmp/sorted.txt; wc -l /tmp/sorted.txt";

/// `scripts/check-ro-crate DIR`: whether it passed, and what it printed.
fn check_ro_crate(dir: &Path) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check-ro-crate");
    let output = Command::new(&script)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (it needs python3 with venv)", script.display()));
    let printed = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    // The validator's report, for whoever runs the test with --nocapture.
    eprintln!("scripts/check-ro-crate {}:\n{printed}", dir.display());
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "the check could not run: {printed}"
    );
    (output.status.success(), printed)
}

fn export(trace: &Path, dir: &Path, extra: &[&str]) -> common::Finished {
    let mut args = vec!["export", "ro-crate", path(trace), "-o", path(dir)];
    args.extend_from_slice(extra);
    provm(&args)
}

/// The entity of the metadata's graph with this @id.
fn entity<'a>(metadata: &'a Value, id: &str) -> &'a Value {
    metadata["@graph"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entity| entity["@id"] == id)
        .unwrap_or_else(|| panic!("no entity {id} in {metadata:#}"))
}

/// The entities an action's property refers to.
fn referred<'a>(metadata: &'a Value, action: &Value, property: &str) -> Vec<&'a Value> {
    action[property]
        .as_array()
        .unwrap()
        .iter()
        .map(|reference| entity(metadata, reference["@id"].as_str().unwrap()))
        .collect()
}

/// The one entity of `entities` named `name`.
fn named<'a>(entities: &[&'a Value], name: &str) -> &'a Value {
    entities
        .iter()
        .find(|entity| entity["name"] == name)
        .unwrap_or_else(|| panic!("nothing named {name} in {entities:#?}"))
}

#[test]
fn a_recorded_runs_crate_is_a_valid_process_run_crate() {
    let _guest = one_guest_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.provm");
    let prov = dir.path().join("run.prov");
    let recorded = record_shell(
        &images().tiny_qcow2,
        &trace,
        &["--prov", path(&prov)],
        SCRIPT,
    );
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);

    let crate_dir = dir.path().join("crate");
    let exported = export(&trace, &crate_dir, &["--license", "CC-BY-4.0"]);
    assert_eq!(exported.status, 0, "{}", exported.stderr);
    assert_eq!(digest(&crate_dir.join("run.provm")), digest(&trace));
    let readme = std::fs::read_to_string(crate_dir.join("README.md")).unwrap();
    for expected in [
        "provm inspect run.provm",
        "provm replay --image IMAGE run.provm",
        "tiny.qcow2",
        &digest(&images().tiny_qcow2),
        &digest(&trace),
    ] {
        assert!(readme.contains(expected), "{expected} not in {readme}");
    }

    let metadata: Value =
        serde_json::from_slice(&std::fs::read(crate_dir.join("ro-crate-metadata.json")).unwrap())
            .unwrap();
    let root = entity(&metadata, "./");
    assert_eq!(
        root["conformsTo"]["@id"],
        "https://w3id.org/ro/wfrun/process/0.5"
    );
    assert_eq!(
        root["license"]["@id"],
        "https://spdx.org/licenses/CC-BY-4.0"
    );
    let action = entity(&metadata, root["mentions"]["@id"].as_str().unwrap());
    assert_eq!(action["@type"], "CreateAction");
    let provm_app = entity(&metadata, action["instrument"]["@id"].as_str().unwrap());
    assert_eq!(provm_app["@type"], "SoftwareApplication");
    assert_eq!(provm_app["version"], env!("CARGO_PKG_VERSION"));
    assert!(action["startTime"].as_str().unwrap() <= action["endTime"].as_str().unwrap());
    let objects = referred(&metadata, action, "object");
    assert_eq!(
        named(&objects, "tiny.qcow2")["sha256"],
        digest(&images().tiny_qcow2)
    );
    assert!(named(&objects, "the guest kernel")["sha256"].is_string());
    // The file the command read, by guest path and digest.
    let input = named(&objects, "/data/in.txt");
    assert_eq!(input["sha256"], sha256_of(b"pear\napple\nfig\n"));
    let results = referred(&metadata, action, "result");
    assert_eq!(
        named(&results, "/tmp/sorted.txt")["sha256"],
        sha256_of(b"apple\nfig\npear\n")
    );
    assert_eq!(
        named(&results, "the provm trace of the run")["@id"],
        "run.provm"
    );

    let (valid, report) = check_ro_crate(&crate_dir);
    assert!(valid, "the crate is not valid: {report}");
    assert!(
        report.contains("RO-Crate is a valid process-run-crate"),
        "{report}"
    );

    // The check can fail: without the profile's conformsTo it does.
    let broken = without_conforms_to(&crate_dir, &dir.path().join("broken"));
    let (valid, report) = check_ro_crate(&broken);
    assert!(!valid, "a crate without conformsTo passed: {report}");
    assert!(report.contains("conformsTo"), "{report}");

    // The crate's directory is not written over without --force.
    let again = export(&trace, &crate_dir, &[]);
    assert_eq!(again.status, PROVM_FAILED, "{}", again.stderr);
    assert!(
        again.stderr.contains("not empty") && again.stderr.contains("--force"),
        "{}",
        again.stderr
    );
    let forced = export(&trace, &crate_dir, &["--force"]);
    assert_eq!(forced.status, 0, "{}", forced.stderr);
    assert!(forced.stderr.contains("no --license"), "{}", forced.stderr);
}

/// Run 1 sorts a file into /out, which --output copies to the host; run 2
/// gets that copy with --input at another path and reads it.
#[test]
fn two_runs_make_a_provenance_run_crate_linked_by_the_file_they_share() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("sort.provm"), dir.path().join("head.provm"));
    let out = dir.path().join("out");
    let sorted = out.join("sorted.txt");
    let input = format!("{}:/in/sorted.txt", path(&sorted));
    let output = format!("/out:{}", path(&out));
    let record = |trace: &Path, transfer: [&str; 2], script: &str| {
        let prov = trace.with_extension("prov");
        let mut extra = vec!["--prov", path(&prov)];
        extra.extend(transfer);
        let recorded = record_shell(&images().tiny_qcow2, trace, &extra, script);
        assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    };
    {
        let _guest = one_guest_at_a_time();
        record(
            &first,
            ["--output", &output],
            "sort /data/in.txt > /out/sorted.txt",
        );
        record(&second, ["--input", &input], "head -n 1 /in/sorted.txt");
    }
    let shared = sha256_of(b"apple\nfig\npear\n");
    assert_eq!(digest(&sorted), shared);

    let crate_dir = dir.path().join("crate");
    let exported = provm(&[
        "export",
        "ro-crate",
        path(&first),
        path(&second),
        "-o",
        path(&crate_dir),
    ]);
    assert_eq!(exported.status, 0, "{}", exported.stderr);
    let metadata: Value =
        serde_json::from_slice(&std::fs::read(crate_dir.join("ro-crate-metadata.json")).unwrap())
            .unwrap();
    // One entity for the file, whatever each run called it: a result of
    // step 1 and an object of step 2.
    let file_id = format!("#sha256-{shared}");
    let file = entity(&metadata, &file_id);
    assert_eq!(file["name"], "/out/sorted.txt");
    assert_eq!(file["alternateName"], "/in/sorted.txt");
    let ids = |action: &str, property: &str| -> Vec<String> {
        referred(&metadata, entity(&metadata, action), property)
            .iter()
            .map(|entity| entity["@id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(ids("#step-1/run", "result").contains(&file_id));
    assert!(ids("#step-2/run", "object").contains(&file_id));
    assert!(
        !ids("#run", "object").contains(&file_id),
        "made by a step, not the workflow's input"
    );
    assert_eq!(
        ids("#organize", "object"),
        ["#step-1/control", "#step-2/control"]
    );
    let workflow = entity(&metadata, "workflow.sh");
    assert!(std::fs::read_to_string(crate_dir.join("workflow.sh"))
        .unwrap()
        .contains("provm replay head.provm"));
    assert_eq!(workflow["step"].as_array().unwrap().len(), 2);

    let (valid, report) = check_ro_crate(&crate_dir);
    assert!(valid, "the crate is not valid: {report}");
    assert!(
        report.contains("RO-Crate is a valid provenance-run-crate"),
        "{report}"
    );
    // The check can fail: a workflow that does not name its steps is not
    // a Provenance Run Crate.
    let broken = edited_copy(&crate_dir, &dir.path().join("broken"), |graph| {
        let workflow = graph
            .iter_mut()
            .find(|e| e["@id"] == "workflow.sh")
            .unwrap();
        workflow.as_object_mut().unwrap().remove("step").unwrap();
    });
    let (valid, report) = check_ro_crate(&broken);
    assert!(!valid, "a workflow without its steps passed: {report}");
    assert!(report.contains("HowToStep"), "{report}");

    // The graph of both runs: one node for the file, written by run 1 and
    // read by run 2.
    let graph = provm(&["graph", path(&first), path(&second)]);
    assert_eq!(graph.status, 0, "{}", graph.stderr);
    let node = format!("\"sha256/{shared}\"");
    let drawn = |what: &str| {
        graph
            .stdout
            .lines()
            .filter(|line| line.contains(what))
            .count()
    };
    assert_eq!(
        drawn(&format!("{node} [shape=ellipse")),
        1,
        "{}",
        graph.stdout
    );
    assert_eq!(drawn(&format!("{node} -> \"run1/")), 1, "{}", graph.stdout);
    assert_eq!(
        drawn(&format!("\"run2/process/0\" -> {node} [label=\"used\"]")),
        1,
        "{}",
        graph.stdout
    );

    // Which runs depend on the file: the second.
    let sql = format!("SELECT DISTINCT run, path FROM depends_on WHERE sha256 = '{shared}'");
    let query = provm(&[
        "query",
        "--format",
        "csv",
        path(&first),
        path(&second),
        &sql,
    ]);
    assert_eq!(query.status, 0, "{}", query.stderr);
    assert_eq!(
        query.stdout,
        format!("run,path\n{},/in/sorted.txt\n", path(&second))
    );
}

/// docs/examples/workflow/Makefile, run by make on the tiny image: three
/// recorded steps, each reading what the one before wrote, and their crate.
#[test]
fn a_three_step_makefile_deposits_one_crate_linking_its_steps_by_digest() {
    let dir = tempfile::tempdir().unwrap();
    let makefile = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/workflow/Makefile");
    let made = {
        let _guest = one_guest_at_a_time();
        Command::new("make")
            .arg("-f")
            .arg(&makefile)
            .arg("-C")
            .arg(dir.path())
            .arg(format!("PROVM={}", env!("CARGO_BIN_EXE_provm")))
            .arg(format!("IMAGE={}", path(&images().tiny_qcow2)))
            .arg("crate")
            .output()
            .expect("make runs")
    };
    assert!(
        made.status.success(),
        "make failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("step3/top.txt")).unwrap(),
        "      3 apple\n"
    );

    let crate_dir = dir.path().join("crate");
    let metadata: Value =
        serde_json::from_slice(&std::fs::read(crate_dir.join("ro-crate-metadata.json")).unwrap())
            .unwrap();
    // What step N wrote is, by its digest, a result of step N and an
    // object of step N + 1.
    let handed_on = [(1, "step1/sorted.txt"), (2, "step2/counts.txt")];
    for (step, file) in handed_on {
        let id = format!("#sha256-{}", digest(&dir.path().join(file)));
        assert!(
            refers(&metadata, &format!("#step-{step}/run"), "result", &id),
            "{file} is not a result of step {step}"
        );
        assert!(
            refers(&metadata, &format!("#step-{}/run", step + 1), "object", &id),
            "{file} is not an object of step {}",
            step + 1
        );
    }
    // The check fails on a crate without the link.
    let (_, file) = handed_on[0];
    let id = format!("#sha256-{}", digest(&dir.path().join(file)));
    let mut unlinked = metadata.clone();
    let step2 = unlinked["@graph"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|entity| entity["@id"] == "#step-2/run")
        .unwrap();
    step2["object"]
        .as_array_mut()
        .unwrap()
        .retain(|reference| reference["@id"] != id.as_str());
    assert!(!refers(&unlinked, "#step-2/run", "object", &id));

    let (valid, report) = check_ro_crate(&crate_dir);
    assert!(valid, "the crate is not valid: {report}");
    assert!(
        report.contains("RO-Crate is a valid provenance-run-crate"),
        "{report}"
    );
}

/// Whether the action `action`'s `property` refers to the entity `id`
/// (which the graph holds).
fn refers(metadata: &Value, action: &str, property: &str, id: &str) -> bool {
    referred(metadata, entity(metadata, action), property)
        .iter()
        .any(|entity| entity["@id"] == id)
}

fn sha256_of(bytes: &[u8]) -> String {
    use sha2::Digest;
    provm_trace::hex(&sha2::Sha256::digest(bytes))
}

/// A copy of the crate in `copy` whose root no longer names the profile.
fn without_conforms_to(crate_dir: &Path, copy: &Path) -> PathBuf {
    edited_copy(crate_dir, copy, |graph| {
        let root = graph
            .iter_mut()
            .find(|entity| entity["@id"] == "./")
            .unwrap();
        root.as_object_mut().unwrap().remove("conformsTo").unwrap();
    })
}

/// A copy of the crate in `copy` whose metadata's graph `edit` changed.
fn edited_copy(crate_dir: &Path, copy: &Path, edit: impl FnOnce(&mut Vec<Value>)) -> PathBuf {
    std::fs::create_dir(copy).unwrap();
    for entry in std::fs::read_dir(crate_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::hard_link(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let metadata_path = copy.join("ro-crate-metadata.json");
    let mut metadata: Value =
        serde_json::from_slice(&std::fs::read(&metadata_path).unwrap()).unwrap();
    edit(metadata["@graph"].as_array_mut().unwrap());
    // Replaced, not written through the hard link into the original.
    std::fs::remove_file(&metadata_path).unwrap();
    std::fs::write(&metadata_path, serde_json::to_vec(&metadata).unwrap()).unwrap();
    copy.to_owned()
}
