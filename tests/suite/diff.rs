//! End-to-end `provm diff` on real recordings: `query.rs`'s shared runs
//! (`echo plain` and `echo untimed`), and `echo plain` recorded once more,
//! which differs from the first only by the host's entropy and clock.

use crate::common;
use crate::query;

use common::{images, one_guest_at_a_time, path, provm, record_shell, Finished, PROVM_FAILED};

fn diff(first: &std::path::Path, second: &std::path::Path) -> Finished {
    provm(&["diff", path(first), path(second)])
}

#[test]
fn diff_names_where_two_runs_parted_and_what_differs() {
    let recorded = query::recorded();
    let again = common::scratch(module_path!()).join("plain-again.provm");
    {
        let _guest = one_guest_at_a_time();
        let finished = record_shell(&images().tiny_qcow2, &again, &[], "echo plain");
        assert_eq!(finished.status, 0, "{}", finished.stderr);
    }

    let same = diff(&recorded.plain, &recorded.plain);
    assert_eq!(same.status, 0, "{}{}", same.stdout, same.stderr);
    assert!(
        same.stdout.contains("verdict    the same run"),
        "{}",
        same.stdout
    );

    // The same command again: the job the host sent (the first event, as
    // the snapshot is taken before it) has fresh entropy and a later clock.
    let rerun = diff(&recorded.plain, &again);
    assert_eq!(rerun.status, 1, "{}{}", rerun.stdout, rerun.stderr);
    for expected in [
        "setup      the same command, image, kernel and machine",
        "the logs part at event 0: the job the host sent the agent: its entropy and wall clock differ",
    ] {
        assert!(rerun.stdout.contains(expected), "{expected:?} in:\n{}", rerun.stdout);
    }
    assert!(!rerun.stdout.contains("stdout differs"), "{}", rerun.stdout);

    // Another command: its setup first, then its output.
    let other = provm(&[
        "diff",
        "--json",
        path(&recorded.plain),
        path(&recorded.untimed),
    ]);
    assert_eq!(other.status, 1, "{}{}", other.stdout, other.stderr);
    let json: serde_json::Value = serde_json::from_str(&other.stdout).unwrap();
    assert_eq!(json["same"], false);
    assert_eq!(json["setup"][0]["what"], "command", "{json:#}");
    assert_eq!(json["parting"]["event"], 0, "{json:#}");
    let outputs = json["outputs"].as_array().unwrap();
    assert!(outputs.contains(&"stdout differs".into()), "{json:#}");

    let missing = diff(&recorded.plain, &again.with_extension("missing"));
    assert_eq!(missing.status, PROVM_FAILED);
    assert!(
        missing.stderr.contains("plain-again.missing")
            && missing.stderr.contains("provm record -o"),
        "{}",
        missing.stderr
    );
}
