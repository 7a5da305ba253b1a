//! Container images built here with the tar crate: three layers with a
//! whiteout, an opaque directory, a hard link, a device node, owners and
//! an extended attribute; and the bad inputs each refused with nothing
//! written.

use std::path::{Path, PathBuf};
use std::process::Command;

use oci_spec::image::{Arch, ConfigBuilder};

use super::flatten::{Kind, Tree};
use super::layout::{Attributes, LayerWriter, Layout};
use super::*;

/// The three layers: the second whites out /etc/gone and makes /opt
/// opaque (after adding /opt/new, which stays: its own layer's), the
/// third whites out the symbolic link /etc/link.
fn layers() -> Vec<Vec<u8>> {
    let mut base = LayerWriter::new(1_000_000);
    base.directory("etc", 0o755).unwrap();
    base.file("etc/keep", 0o644, b"keep\n").unwrap();
    base.file("etc/gone", 0o644, b"gone\n").unwrap();
    base.symlink("etc/link", "keep").unwrap();
    let owned = Attributes {
        uid: 1000,
        gid: 100,
        xattrs: &[("user.provm", b"yes")],
    };
    base.file_with("etc/owned", 0o600, &owned, b"owned\n")
        .unwrap();
    base.directory("opt", 0o755).unwrap();
    base.file("opt/old", 0o644, b"old\n").unwrap();
    base.directory("opt/old-dir", 0o755).unwrap();
    base.file("opt/old-dir/inside", 0o644, b"old\n").unwrap();
    base.char_device("dev/null", 0o666, 1, 3).unwrap();
    let mut middle = LayerWriter::new(1_000_000);
    middle.whiteout("etc/gone").unwrap();
    middle.file("opt/new", 0o644, b"new\n").unwrap();
    middle.opaque("opt").unwrap();
    middle.hard_link("etc/hard", "etc/keep").unwrap();
    let mut top = LayerWriter::new(1_000_000);
    top.whiteout("etc/link").unwrap();
    top.file("srv/data/file", 0o644, b"data\n").unwrap();
    [base, middle, top]
        .into_iter()
        .map(|layer| layer.finish().unwrap())
        .collect()
}

/// A layer of one entry named `name`, which the tar crate would refuse
/// to write: its header set by hand.
fn raw_name(name: &str) -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(0);
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_cksum();
    let mut tar = tar::Builder::new(Vec::new());
    tar.append(&header, &[][..]).unwrap();
    tar.into_inner().unwrap()
}

/// The layer `write` writes.
fn layer(write: impl FnOnce(&mut LayerWriter) -> std::io::Result<()>) -> Vec<u8> {
    let mut layer = LayerWriter::new(0);
    write(&mut layer).unwrap();
    layer.finish().unwrap()
}

const LISTING: &[&str] = &[
    "",
    "dev",
    "dev/null",
    "etc",
    "etc/hard",
    "etc/keep",
    "etc/owned",
    "opt",
    "opt/new",
    "srv",
    "srv/data",
    "srv/data/file",
];

fn flattened(layers: &[Vec<u8>], staging: &Path) -> Result<Tree, ContainerError> {
    let mut tree = Tree::new(staging);
    for (index, layer) in layers.iter().enumerate() {
        tree.apply(index + 1, &layer[..])?;
    }
    Ok(tree)
}

fn listing(tree: &Tree) -> Vec<String> {
    tree.nodes
        .keys()
        .map(|path| path.display().to_string())
        .collect()
}

#[test]
fn whiteouts_and_opaque_directories_hide_the_layers_below() {
    let staging = tempfile::tempdir().unwrap();
    let tree = flattened(&layers(), staging.path()).unwrap();
    assert_eq!(listing(&tree), LISTING);
    let staged = |path: &str| staging.path().join(path);
    assert!(!staged("etc/gone").exists());
    assert!(!staged("opt/old-dir").exists());
    assert_eq!(
        std::fs::read_to_string(staged("etc/hard")).unwrap(),
        "keep\n"
    );
    let owned = &tree.nodes[Path::new("etc/owned")];
    assert_eq!((owned.uid, owned.gid, owned.mode), (1000, 100, 0o600));
    assert_eq!(owned.xattrs["user.provm"], b"yes");
    assert_eq!(
        tree.nodes[Path::new("dev/null")].kind,
        Kind::CharDevice { major: 1, minor: 3 }
    );
}

#[test]
fn a_layer_that_replaces_a_directory_with_a_file_drops_what_it_held() {
    let staging = tempfile::tempdir().unwrap();
    let layers = [
        layer(|l| l.file("a/b/c", 0o644, b"c")),
        layer(|l| l.file("a/b", 0o644, b"now a file")),
    ];
    let tree = flattened(&layers, staging.path()).unwrap();
    assert_eq!(listing(&tree), ["", "a", "a/b"]);
}

#[test]
fn entries_that_leave_the_root_are_refused() {
    for escaping in [
        raw_name("../escaped"),
        raw_name("etc/../../escaped"),
        layer(|l| l.hard_link("etc/hard", "../../etc/passwd")),
    ] {
        let outer = tempfile::tempdir().unwrap();
        let staging = outer.path().join("root");
        std::fs::create_dir(&staging).unwrap();
        let error = flattened(&[escaping], &staging).err().unwrap();
        assert!(
            matches!(error, ContainerError::Escapes { layer: 1, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("outside the root"), "{error}");
        assert!(!outer.path().join("escaped").exists());
    }
    // Through a symbolic link the layers made: refused too.
    let staging = tempfile::tempdir().unwrap();
    let layers = [
        layer(|l| l.symlink("up", "/tmp")),
        layer(|l| l.file("up/planted", 0o644, b"x")),
    ];
    let error = flattened(&layers, staging.path()).err().unwrap();
    assert!(error.to_string().contains("not a directory"), "{error}");
}

fn config() -> oci_spec::image::Config {
    ConfigBuilder::default()
        .env(vec!["PATH=/bin".to_owned(), "GREETING=hello".to_owned()])
        .working_dir("/srv/data".to_owned())
        .user("1000:100".to_owned())
        .entrypoint(vec!["/bin/sh".to_owned(), "-c".to_owned()])
        .cmd(vec!["echo $GREETING".to_owned()])
        .build()
        .unwrap()
}

/// The test image as an OCI layout in `dir`/layout, and as an oci-archive.
fn write_layout(dir: &Path, architecture: Arch) -> (PathBuf, PathBuf, Layout) {
    let layout = Layout::new(architecture, config(), layers(), "test").unwrap();
    let layout_dir = dir.join("layout");
    layout.write_dir(&layout_dir).unwrap();
    let archive = dir.join("image.tar");
    std::fs::write(&archive, layout.tar().unwrap()).unwrap();
    (layout_dir, archive, layout)
}

fn reference(text: &str) -> ImageRef {
    ImageRef::parse(text)
}

/// `skopeo copy` of the layout to a docker archive: the format as docker
/// and skopeo write it, not as this test imagines it.
fn docker_archive(layout: &Path, archive: &Path) {
    let output = Command::new("skopeo")
        .arg("copy")
        .arg(format!("oci:{}:test", layout.display()))
        .arg(format!("docker-archive:{}:provm/test:1", archive.display()))
        .output()
        .expect("this test needs skopeo: run scripts/install-deps");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn debugfs(disk: &Path, request: &str) -> String {
    let output = Command::new("debugfs")
        .arg("-R")
        .arg(request)
        .arg(disk)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn every_form_of_the_image_gives_the_same_disk_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (layout_dir, archive, layout) = write_layout(dir.path(), Arch::Amd64);
    let docker = dir.path().join("docker.tar");
    docker_archive(&layout_dir, &docker);

    let from_layout = resolve_in(
        &reference(&format!("oci:{}:test", layout_dir.display())),
        &cache,
    )
    .unwrap();
    let container = from_layout.container.clone().unwrap();
    assert_eq!(container.digest, layout.manifest_digest());
    assert_eq!(container.digest_kind, DigestKind::Manifest);
    assert_eq!(
        container.config,
        ContainerConfig {
            env: vec!["PATH=/bin".into(), "GREETING=hello".into()],
            working_dir: Some("/srv/data".into()),
            user: Some("1000:100".into()),
            command: vec!["/bin/sh".into(), "-c".into(), "echo $GREETING".into()],
        }
    );
    let archive_bytes = std::fs::read(&archive).unwrap();
    let from_archive = resolve_in(
        &reference(&format!("oci-archive:{}", archive.display())),
        &cache,
    )
    .unwrap();
    assert!(
        std::fs::read(&archive).unwrap() == archive_bytes,
        "the user's image was written"
    );
    assert_eq!(
        from_archive.disk, from_layout.disk,
        "the same manifest: the cached disk"
    );
    let from_docker = resolve_in(
        &reference(&format!("docker-archive:{}:provm/test:1", docker.display())),
        &cache,
    )
    .unwrap();
    assert_eq!(
        from_docker.container.as_ref().unwrap().digest_kind,
        DigestKind::ImageId
    );
    assert_ne!(from_docker.disk, from_layout.disk);
    let disk = std::fs::read(&from_layout.disk).unwrap();
    assert!(
        disk == std::fs::read(&from_docker.disk).unwrap(),
        "the same layers give the same disk bytes"
    );

    // Built again from scratch: the same bytes.
    std::fs::remove_file(&from_layout.disk).unwrap();
    let again = resolve_in(
        &reference(&format!("oci:{}:test", layout_dir.display())),
        &cache,
    )
    .unwrap();
    assert!(
        disk == std::fs::read(&again.disk).unwrap(),
        "a rebuilt disk differs"
    );

    let root = debugfs(&again.disk, "ls -p /");
    assert!(!root.contains("lost+found"), "{root}");
    let owned = debugfs(&again.disk, "stat /etc/owned");
    assert!(owned.contains("User:  1000   Group:   100"), "{owned}");
    assert!(owned.contains("Mode:  0600"), "{owned}");
    assert!(owned.contains("user.provm (3) = \"yes\""), "{owned}");
    assert!(owned.contains("mtime: 0x000f4240"), "{owned}");
    let device = debugfs(&again.disk, "stat /dev/null");
    assert!(device.contains("Type: character special"), "{device}");
    assert!(
        device.contains("major: 1, minor: 3")
            || device.contains("Device major/minor number: 01:03"),
        "{device}"
    );
    let keep = debugfs(&again.disk, "stat /etc/keep");
    assert!(keep.contains("Links: 2"), "{keep}");
    assert!(debugfs(&again.disk, "stat /etc/gone").is_empty());
}

/// Refused with `expected` in the message, and nothing in the cache.
fn refused(text: &str, cache: &Path, expected: &str) -> ContainerError {
    let error = resolve_in(&reference(text), cache)
        .err()
        .unwrap_or_else(|| panic!("{text} was accepted"));
    assert!(error.to_string().contains(expected), "{text}: {error}");
    let written = std::fs::read_dir(cache).map(|dir| dir.count()).unwrap_or(0);
    assert_eq!(written, 0, "{text}: something was left in the cache");
    error
}

#[test]
fn bad_images_are_refused_naming_the_problem_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (layout_dir, _, _) = write_layout(dir.path(), Arch::Amd64);
    let docker = dir.path().join("docker.tar");
    docker_archive(&layout_dir, &docker);

    let error = refused(
        &format!("oci:{}:nope", layout_dir.display()),
        &cache,
        "no image tagged nope",
    );
    assert!(error.to_string().contains("the tags test"), "{error}");
    refused(
        &format!("docker-archive:{}:provm/test:2", docker.display()),
        &cache,
        "the tags docker.io/provm/test:1",
    );
    refused(
        &format!("oci:{}", dir.path().display()),
        &cache,
        "not an OCI image layout",
    );

    let arm = dir.path().join("arm");
    std::fs::create_dir(&arm).unwrap();
    write_layout(&arm, Arch::ARM64);
    refused(
        &format!("oci:{}:test", arm.join("layout").display()),
        &cache,
        "is for linux/arm64",
    );

    // A layer's blob changed: its digest no longer matches.
    let blobs = layout_dir.join("blobs/sha256");
    let largest = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .max_by_key(|path| std::fs::metadata(path).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&largest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&largest, &bytes).unwrap();
    let error = refused(
        &format!("oci:{}:test", layout_dir.display()),
        &cache,
        "is corrupt",
    );
    assert!(
        matches!(error, ContainerError::DigestMismatch { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("layer 1"), "{error}");
    assert!(
        error.to_string().contains("copy the image again"),
        "{error}"
    );

    // A blob that leads out of the layout.
    std::fs::remove_file(&largest).unwrap();
    std::fs::write(dir.path().join("outside"), "x").unwrap();
    std::os::unix::fs::symlink("../../../outside", &largest).unwrap();
    let error = refused(
        &format!("oci:{}:test", layout_dir.display()),
        &cache,
        "outside the image's layout",
    );
    assert!(matches!(error, ContainerError::Outside { .. }), "{error}");
}
