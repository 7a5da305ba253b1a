//! A trace is published with a paper: by default it names the host's files
//! by file name and digest, never by path, and still replays; `provm record
//! --keep-host-paths` keeps the paths.

use crate::common;

use std::path::{Path, PathBuf};

use common::{
    assert_replay_matches, digest, images, one_guest_at_a_time, path, provm, provm_with_env,
    record_shell, PROVM_FAILED,
};
use provm_trace::reader::Trace;

const SCRIPT: &str = "sort /data/in.txt > /tmp/sorted.txt; cat /tmp/sorted.txt";

/// The host paths a trace could leak: the image's directory, the kernel
/// cache's (under the recording user's home) and cargo's (in the agent).
fn host_paths() -> Vec<String> {
    let kernel = provm(&["kernel", "path"]);
    assert_eq!(kernel.status, 0, "{}", kernel.stderr);
    let kernel_dir = Path::new(kernel.stdout.trim()).parent().unwrap().to_owned();
    let home = PathBuf::from(std::env::var_os("HOME").unwrap());
    [
        images().tiny_qcow2.parent().unwrap().to_owned(),
        kernel_dir,
        home.join(".cache"),
        home.join(".cargo"),
    ]
    .iter()
    .map(|dir| dir.display().to_string())
    .collect()
}

/// Which of `needles` occur in `haystack`.
fn found_in<'a>(haystack: &[u8], needles: &'a [String]) -> Vec<&'a str> {
    needles
        .iter()
        .filter(|needle| {
            haystack
                .windows(needle.len())
                .any(|window| window == needle.as_bytes())
        })
        .map(String::as_str)
        .collect()
}

/// Records SCRIPT with `--prov` (and `extra`) into `dir/NAME.provm`; returns
/// the trace and everything it holds that could name a host path: the whole
/// file's bytes, its manifest and provenance decoded, its kernel.
fn record(dir: &Path, name: &str, extra: &[&str]) -> (PathBuf, Vec<u8>) {
    let trace = dir.join(format!("{name}.provm"));
    let prov = dir.join(format!("{name}.prov"));
    let mut args = vec!["--prov", path(&prov)];
    args.extend_from_slice(extra);
    let recorded = record_shell(&images().tiny_qcow2, &trace, &args, SCRIPT);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(recorded.stdout, "apple\nfig\npear\n");
    let opened = Trace::open(&trace).unwrap();
    let mut held = std::fs::read(&trace).unwrap();
    held.extend(serde_json::to_vec(&opened.manifest).unwrap());
    held.extend(serde_json::to_vec(&opened.outcome).unwrap());
    held.extend(opened.provenance.clone().unwrap());
    held.extend(opened.kernel().unwrap());
    held.extend(std::fs::read(&prov).unwrap());
    (trace, held)
}

#[test]
fn a_trace_names_no_host_path_and_still_replays_unless_paths_are_kept() {
    let _guest = one_guest_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let host_paths = host_paths();

    let (trace, held) = record(dir.path(), "published", &[]);
    assert_eq!(found_in(&held, &host_paths), Vec::<&str>::new());
    let opened = Trace::open(&trace).unwrap();
    let image = &opened.manifest.image;
    let image_sha256 = digest(&images().tiny_qcow2);
    assert_eq!(image.path, "tiny.qcow2");
    assert_eq!(image.chain[0].path, "tiny.qcow2");
    assert_eq!(image.chain[0].sha256, image_sha256);
    // The provenance names the VM's inputs by role and digest.
    let graph = provm::provenance::load(&trace).unwrap();
    let input = |name: &str| {
        graph
            .entity(&format!("vm/{name}"))
            .unwrap_or_else(|| panic!("no input {name} in {:?}", graph.entities))
    };
    assert_eq!(
        input("image").sha256.as_deref(),
        Some(image_sha256.as_str())
    );
    assert_eq!(input("image").content, ["tiny.qcow2"]);
    assert_eq!(input("kernel").content, ["vmlinux"]);
    assert_eq!(
        input("kernel").sha256.as_deref(),
        Some(opened.manifest.kernel_sha256.as_str())
    );
    assert_eq!(
        input("initramfs").sha256.as_deref(),
        Some(opened.manifest.initramfs_sha256.as_str())
    );

    // This host remembers where it recorded the image.
    assert_replay_matches(&trace);
    // Another host does not: the error names the file and its digest.
    let elsewhere = tempfile::tempdir().unwrap();
    let refused = provm_with_env(
        &["replay", path(&trace)],
        &[("PROVM_CACHE", elsewhere.path())],
    );
    assert_eq!(refused.status, PROVM_FAILED, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("tiny.qcow2") && refused.stderr.contains(&image_sha256),
        "{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("--image"), "{}", refused.stderr);
    // There, the image beside the trace is found by its name.
    std::os::unix::fs::symlink(&images().tiny_qcow2, dir.path().join("tiny.qcow2")).unwrap();
    let beside = provm_with_env(
        &["replay", path(&trace)],
        &[("PROVM_CACHE", elsewhere.path())],
    );
    assert_eq!(beside.status, 0, "{}{}", beside.stdout, beside.stderr);

    let (_, held) = record(dir.path(), "kept", &["--keep-host-paths"]);
    let kept = found_in(&held, &host_paths);
    assert!(kept.contains(&host_paths[0].as_str()), "{kept:?}");
    assert!(kept.contains(&host_paths[1].as_str()), "{kept:?}");
}
