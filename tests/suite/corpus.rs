//! The compatibility corpus (tests/data/corpus/, its README says who
//! recorded each trace): every trace an earlier provm recorded replays
//! exactly with this one, and a trace this provm cannot replay is refused
//! before it starts, saying which provm replays it, while `inspect` still
//! shows what it holds.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{
    assert_replay_matches, one_guest_at_a_time, path, provm, rewrite_trace, PROVM_FAILED,
};
use provm_cpu_model::{self as cpu_model, Baseline, Platform};
use provm_trace::format::{self, SectionKind, FORMAT_VERSION, HEADER_LEN, OLDEST_FORMAT};
use provm_trace::manifest::Manifest;
use provm_trace::reader::Trace;

/// The formats this provm reads, as its messages say them.
fn reads() -> String {
    format!("{OLDEST_FORMAT} to {FORMAT_VERSION}")
}

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus");
    let mut traces: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "provm"))
        .collect();
    traces.sort();
    assert!(!traces.is_empty(), "no traces in {}", dir.display());
    traces
}

/// Why this host cannot give `trace`'s guest the CPU it was recorded with
/// (the check `provm replay` makes first), if it cannot. Most of the
/// corpus was recorded on PVM with that host's CPU: a VMX/SVM host refuses
/// it, and so does a PVM host whose CPU lacks a feature the recording's
/// had; a trace recorded on SVM with a baseline is refused on PVM, which
/// cannot present one to guest user space.
fn cpu_refusal(trace: &Path) -> Option<String> {
    let manifest = Trace::open(trace).unwrap().manifest;
    let here = provm_vmm::cpu_probe::probe_cpu(Baseline::Host).unwrap();
    cpu_model::check_here(
        &manifest.cpu,
        &manifest.host.hypervisor,
        &here,
        Platform::detect(),
    )
    .err()
    .map(|refusal| refusal.to_string())
}

/// Every corpus trace replays exactly where this host can give it its
/// recorded CPU, and is refused before starting, for its CPU alone,
/// elsewhere.
#[test]
fn every_corpus_trace_replays_exactly() {
    let _guest = one_guest_at_a_time();
    for trace in corpus() {
        let recorded = Trace::open(&trace).unwrap();
        let inspect = provm(&["inspect", path(&trace)]);
        assert_eq!(inspect.status, 0, "{}", inspect.stderr);
        let replays = format!(
            "replay     this provm replays it: machine version {},",
            recorded.manifest.machine_version
        );
        assert!(inspect.stdout.contains(&replays), "{}", inspect.stdout);
        match cpu_refusal(&trace) {
            None => {
                // Format 4 predates state checks.
                let replayed = assert_replay_matches(&trace);
                assert_eq!(
                    replayed.contains("state not checked"),
                    recorded.outcome.state_check.is_none(),
                    "{replayed}"
                );
            }
            Some(refusal) => {
                println!("{}: {refusal}", trace.display());
                let replay = provm(&["replay", path(&trace)]);
                assert_eq!(replay.status, PROVM_FAILED, "{}", replay.stderr);
                assert!(replay.stderr.contains(&refusal), "{}", replay.stderr);
            }
        }
    }
}

/// A copy of a corpus trace in `dir` with its header's format version set
/// to `version`.
fn with_format(dir: &Path, version: u16) -> PathBuf {
    let mut bytes = fs::read(&corpus()[0]).unwrap();
    bytes[..HEADER_LEN].copy_from_slice(&format::header(version));
    let copy = dir.join(format!("format-{version}.provm"));
    fs::write(&copy, bytes).unwrap();
    copy
}

/// Replay refuses, with `advice`; inspect shows `shown`.
fn refused(trace: &Path, advice: &str, shown: &[&str]) {
    let replay = provm(&["replay", path(trace)]);
    assert_eq!(replay.status, PROVM_FAILED, "{}", replay.stderr);
    assert!(replay.stderr.contains(advice), "{}", replay.stderr);
    let inspect = provm(&["inspect", path(trace)]);
    assert_eq!(inspect.status, 0, "{}", inspect.stderr);
    assert!(
        inspect.stdout.contains("replay     refused: "),
        "{}",
        inspect.stdout
    );
    assert!(inspect.stdout.contains(advice), "{}", inspect.stdout);
    for line in shown {
        assert!(inspect.stdout.contains(line), "{}", inspect.stdout);
    }
}

#[test]
fn a_newer_format_asks_for_a_newer_provm_and_inspect_shows_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    refused(
        &with_format(dir.path(), 900),
        &format!(
            "newer than this provm reads ({}): use a newer provm",
            reads()
        ),
        &[
            &*format!("format     900 (this provm reads {})", reads()),
            "  argv ",
            "  provm_version          \"0.1.0\"",
        ],
    );
}

#[test]
fn an_older_format_names_the_provm_that_replays_it() {
    let dir = tempfile::tempdir().unwrap();
    refused(
        &with_format(dir.path(), 3),
        &format!("recorded by provm 0.1.0 (commit 96474bd) or an earlier one; this provm reads formats {}: replay it with provm 0.1.0 (commit 96474bd)", reads()),
        &[&*format!("format     3 (this provm reads {})", reads())],
    );
}

#[test]
fn a_newer_machine_version_is_refused_before_the_replay_starts() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("machine-99.provm");
    rewrite_trace(&corpus()[0], &copy, |kind, payload| {
        if kind != SectionKind::Manifest {
            return payload;
        }
        let mut manifest: Manifest = serde_json::from_slice(&payload).unwrap();
        manifest.machine_version = 99;
        serde_json::to_vec(&manifest).unwrap()
    });
    refused(
        &copy,
        &format!(
            "machine version 99; this provm emulates machine versions 1 to {}: use a newer provm",
            provm_vmm::machine_version::CURRENT
        ),
        &["machine    version 99, 64 MiB", "status     complete"],
    );
}
