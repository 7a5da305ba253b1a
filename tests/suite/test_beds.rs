//! The test beds' set-up (scripts/lib/testbed-packages) fetches what each
//! bed runs from whatever the machine has installed: on a machine that has
//! Bochs or QEMU as packages already, as on one that lacks them, the bed
//! unpacks the named packages into its own folder. The machine's state is
//! a scratch dpkg status, one without the packages and one with every
//! package of the set installed, read by apt's real resolver on Debian's
//! real package lists (kept in target/, fetched once and then refreshed).

use std::path::Path;
use std::process::Command;

/// Each bed's set: (apt's target suite or "", the packages it names).
const SETS: &[(&str, &[&str])] = &[
    ("", &["bochs", "bochsbios", "vgabios", "nasm"]),
    (
        "bookworm-backports",
        &[
            "qemu-system-x86",
            "qemu-system-data",
            "seabios",
            "ipxe-qemu",
        ],
    ),
];

/// `packages_for` on the package state `status`: NAME=VERSION lines.
fn packages_for(bed: &Path, status: &Path, suite: &str, names: &[&str]) -> Vec<String> {
    let target = if suite.is_empty() {
        String::new()
    } else {
        format!("-t {suite}")
    };
    library(
        bed,
        status,
        &format!("packages_for {target} {}", names.join(" ")),
    )
}

/// Runs `call` in bash with the library sourced, its package lists in
/// `bed`, on the package state `status`; its standard output's lines.
fn library(bed: &Path, status: &Path, call: &str) -> Vec<String> {
    let script = format!(
        r#"set -euo pipefail
        die() {{ echo "testbed-packages: $*" >&2; exit 1; }}
        note() {{ :; }}
        source scripts/lib/testbed-packages
        {call}"#
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("bed", bed)
        .env("bed_suites", "bookworm bookworm-updates bookworm-backports")
        .env("dpkg_status", status)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The machine's dpkg status less `names`' stanzas (a machine lacking
/// them), through the library's own filter.
fn status_without(names: &[&str], into: &Path) {
    let script = format!(
        "source scripts/lib/testbed-packages; without_packages {} </var/lib/dpkg/status >{}",
        names.join(" "),
        into.display()
    );
    let done = Command::new("bash")
        .args(["-c", &script])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(done.success());
}

/// dpkg's status stanzas for `packages` (NAME=VERSION) installed: their
/// records in the package lists, as dpkg keeps them once installed (apt
/// takes an installed package for the candidate only where the two agree).
fn installed(bed: &Path, packages: &[String]) -> String {
    let records = library(
        bed,
        Path::new("/var/lib/dpkg/status"),
        &format!("apt-cache $(apt_options) show {}", packages.join(" ")),
    );
    let mut stanzas = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for record in records.split(String::is_empty) {
        // A version in two suites is shown twice.
        if record.is_empty() || !seen.insert(record[0].clone()) {
            continue;
        }
        for line in record {
            stanzas.push_str(line);
            stanzas.push('\n');
            if line.starts_with("Package: ") {
                stanzas.push_str("Status: install ok installed\n");
            }
        }
        stanzas.push('\n');
    }
    stanzas
}

#[test]
fn each_bed_fetches_its_packages_whether_or_not_the_machine_has_them() {
    // Kept with the beds' own, so that a fresh clone only refreshes them.
    let bed = provm_engine::kernel::cache_dir().join("testbed-packages-test");
    std::fs::create_dir_all(&bed).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    library(&bed, Path::new("/var/lib/dpkg/status"), "apt_update");
    for (suite, names) in SETS {
        let lacking = scratch.path().join("lacking");
        status_without(names, &lacking);
        let on_a_bare_machine = packages_for(&bed, &lacking, suite, names);
        // The same machine with all of them installed: what the bed found
        // nothing to fetch on before.
        let having = scratch.path().join("having");
        let mut status = std::fs::read_to_string(&lacking).unwrap();
        status.push_str(&installed(&bed, &on_a_bare_machine));
        std::fs::write(&having, status).unwrap();
        let on_a_machine_with_them = packages_for(&bed, &having, suite, names);
        for name in *names {
            let fetched = |list: &[String]| {
                list.iter()
                    .find(|p| p.starts_with(&format!("{name}=")))
                    .cloned()
            };
            let bare = fetched(&on_a_bare_machine);
            assert!(bare.is_some(), "{name}: {on_a_bare_machine:?}");
            assert_eq!(
                fetched(&on_a_machine_with_them),
                bare,
                "{name}, installed: {on_a_machine_with_them:?}"
            );
        }
    }
}
