//! Container images as guests: an OCI layout and skopeo's docker-archive
//! of it boot with their layers flattened (whiteouts, an opaque directory,
//! a hard link, an owner, a device node) and their configuration honoured;
//! a recording names the image by its manifest digest (inspect, the
//! RO-Crate, repro show it), replays with the image deleted, and exports
//! as an OCI image that boots again. Both forms of the image make the same
//! disk, so the tests cold-boot two guests: that disk's and the export's.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{
    assert_replay_matches, container_image, one_guest_at_a_time, path, provm, scratch,
    CONTAINER_CMD_OUTPUT,
};

/// What the guest shows of the layers: /etc/gone whited out, /opt's lower
/// files hidden by the opaque marker, /etc/hard a second name of
/// /etc/keep, /etc/owned's owner and mode, /srv/null a device node.
const LISTING: &str = "ls -A /etc /opt; stat -c '%n %u:%g %a %h %F' /etc/owned /etc/hard /srv/null";
const LISTED: &str = "/etc:
group
hard
keep
owned
passwd

/opt:
new
/etc/owned 1000:100 600 1 regular file
/etc/hard 0:0 644 2 regular file
/srv/null 0:0 666 1 character special file
";

#[test]
fn a_container_image_boots_from_its_layout_and_from_a_docker_archive() {
    let _guest = one_guest_at_a_time();
    let image = container_image();
    for reference in [&image.oci, &image.docker_archive] {
        let run = provm(&["run", reference, "--", "sh", "-c", LISTING]);
        assert_eq!(run.status, 0, "{reference}: {}", run.stderr);
        assert_eq!(run.stdout, LISTED, "{reference}");
    }
    // No command: the image's Cmd, with its Env, WorkingDir and User.
    let default = provm(&["run", &image.docker_archive]);
    assert_eq!(default.stdout, CONTAINER_CMD_OUTPUT, "{}", default.stderr);
    // repro names the image it checked by digest.
    let repro = provm(&["repro", &image.oci, "--", "cat", "/etc/keep"]);
    assert_eq!(repro.status, 0, "{}{}", repro.stdout, repro.stderr);
    let digest = manifest_digest(&image.layout);
    assert!(
        repro
            .stderr
            .contains(&format!("{}: manifest {digest}", image.oci)),
        "{}",
        repro.stderr
    );
}

/// The digest of the one manifest in the layout at `layout`.
fn manifest_digest(layout: &Path) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"].as_str().unwrap().to_owned()
}

#[test]
fn a_recording_names_its_container_image_and_exports_as_one_that_boots() {
    let _guest = one_guest_at_a_time();
    let dir = scratch(module_path!());
    // A copy of the layout, deleted once recorded.
    let layout = dir.join("layout");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&container_image().layout)
        .arg(&layout)
        .status()
        .unwrap();
    assert!(copied.success());
    let digest = manifest_digest(&layout);
    let trace = dir.join("run.provm");
    let prov = dir.join("run.prov");
    let recorded = provm(&[
        "record",
        "--prov",
        path(&prov),
        "-o",
        path(&trace),
        &format!("oci:{}:test", layout.display()),
        "--",
        "sh",
        "-c",
        "cat /etc/keep hello",
    ]);
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    assert_eq!(recorded.stdout, "keep\nhello\n");

    let inspect = provm(&["inspect", path(&trace)]);
    let named = format!("made of the container image oci:layout:test (manifest {digest})");
    assert!(inspect.stdout.contains(&named), "{}", inspect.stdout);
    assert!(
        inspect.stdout.contains("\nuser       app\n"),
        "{}",
        inspect.stdout
    );
    let crate_dir = dir.join("crate");
    let exported = provm(&["export", "ro-crate", path(&trace), "-o", path(&crate_dir)]);
    assert_eq!(exported.status, 0, "{}", exported.stderr);
    let metadata = std::fs::read_to_string(crate_dir.join("ro-crate-metadata.json")).unwrap();
    assert!(
        metadata.contains(&format!("\"identifier\": \"{digest}\"")),
        "{metadata}"
    );

    // The disk is in provm's cache: the image itself is not needed.
    std::fs::remove_dir_all(&layout).unwrap();
    assert_replay_matches(&trace);

    let archive = dir.join("exported.tar");
    let exported = provm(&["export", "oci", path(&trace), "-o", path(&archive)]);
    assert_eq!(exported.status, 0, "{}", exported.stderr);
    let rerun = provm(&["run", &format!("oci-archive:{}:run", archive.display())]);
    assert_eq!(rerun.status, 0, "{}", rerun.stderr);
    assert_eq!(rerun.stdout, "keep\nhello\n");
}
