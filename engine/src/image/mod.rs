//! Container images as guests. `provm run oci:DIR:TAG -- cmd` (and
//! `oci-archive:`, `docker-archive:`; see `reference`) resolves the image
//! early into a disk the rest of provm opens like any raw image: its layers
//! are checked (`source`), flattened (`flatten`) and made into an ext4 file
//! system (`ext4`), built once per image and kept in provm's cache under
//! the image's digest. The disk's bytes depend on the layers only, so the
//! same image always gives the same disk (and shares the booted guest's
//! cached snapshot), whatever it was read from. The user's image is only
//! read.

mod blobs;
pub(crate) mod ext4;
pub(crate) mod flatten;
pub mod layout;
pub mod reference;
pub mod root_dir;
mod source;
#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use reference::{ImageRef, Transport};
pub use source::DigestKind;

use crate::kernel::cache_dir;
use crate::notice;
use blobs::Blobs;
use source::Image;

/// Bumped whenever the disk made of an image changes, so that disks of an
/// earlier layout are not used from the cache.
const DISK_FORMAT: &str = "v1";

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("{image}: not a directory; oci: takes an OCI image layout's directory (oci-archive: takes a tar of one)")]
    NotADirectory { image: String },
    #[error("{image} is not an OCI image layout (it has no oci-layout file); `skopeo copy docker://NAME oci:DIR:TAG` makes one")]
    NotALayout { image: String },
    #[error("{image} has no {name}: the image is incomplete; copy it again")]
    Missing { image: String, name: String },
    #[error("{image} names {name}, which lies outside the image's layout: refusing to read it; the image is malformed or crafted")]
    Outside { image: String, name: String },
    #[error("{image} is malformed: {what}")]
    Malformed { image: String, what: String },
    #[error("{image} has no image tagged {tag}; it has {}: name one of those", list(.available))]
    MissingTag {
        image: String,
        tag: String,
        available: Vec<String>,
    },
    #[error("{image} holds several images ({}): name one, as in oci:DIR:TAG or docker-archive:FILE:NAME:TAG", list(.available))]
    Ambiguous {
        image: String,
        available: Vec<String>,
    },
    #[error("{image} is for {found}; provm runs linux/amd64 guests: use the image's linux/amd64 variant (e.g. `skopeo copy --override-arch amd64 ...`)")]
    Architecture { image: String, found: String },
    #[error("{image}: {what} is corrupt: its content has the digest {found}, the image says {expected}; copy the image again")]
    DigestMismatch {
        image: String,
        what: String,
        expected: String,
        found: String,
    },
    #[error("layer {layer} has the entry {entry:?}, which lies outside the root file system: refusing the image; it is malformed or crafted")]
    Escapes { layer: usize, entry: String },
    #[error("layer {layer}: {what}")]
    Layer { layer: usize, what: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("building the image's disk: {tool} failed: {message}")]
    Tool { tool: String, message: String },
}

fn list(items: &[String]) -> String {
    match items {
        [] => "no tags".to_owned(),
        items => format!("the tags {}", items.join(", ")),
    }
}

/// What a container image's configuration asks of the command run in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    /// The command when none is given: Entrypoint then Cmd.
    pub command: Vec<String>,
}

/// A container image resolved to a disk.
#[derive(Clone, Debug)]
pub struct Container {
    /// As the user named it.
    pub reference: ImageRef,
    /// `sha256:...`: its manifest's digest, or a docker archive's image ID.
    pub digest: String,
    pub digest_kind: DigestKind,
    pub config: ContainerConfig,
}

/// The disk the guest boots from an image reference, and the container
/// image it was made of, if it was.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub disk: PathBuf,
    pub container: Option<Container>,
}

/// Resolves `reference`: a disk image is itself; a container image is
/// read, checked and, unless its disk is in provm's cache, made into one.
pub fn resolve(reference: &ImageRef) -> Result<Resolved, ContainerError> {
    resolve_in(reference, &cache_dir().join("container-disks"))
}

/// `resolve`, with the disks made kept in `cache`.
fn resolve_in(reference: &ImageRef, cache: &Path) -> Result<Resolved, ContainerError> {
    let ImageRef::Container {
        transport,
        path,
        tag,
    } = reference
    else {
        return Ok(Resolved {
            disk: reference.path().to_owned(),
            container: None,
        });
    };
    let name = reference.to_string();
    let blobs = match transport {
        Transport::Oci => Blobs::dir(&name, path)?,
        Transport::OciArchive | Transport::DockerArchive => Blobs::archive(&name, path)?,
    };
    let image = Image::read(*transport, blobs, &name, tag.as_deref())?;
    notice!("{name}: {} {}", image.digest_kind, image.digest);
    let hex = image.digest.trim_start_matches("sha256:");
    let disk = cache.join(format!("{DISK_FORMAT}-{hex}.ext4"));
    if !disk.exists() {
        build_disk(&image, &name, &disk)?;
    }
    Ok(Resolved {
        disk,
        container: Some(Container {
            reference: reference.clone(),
            digest: image.digest.clone(),
            digest_kind: image.digest_kind,
            config: config_of(&image),
        }),
    })
}

/// Flattens `image` into a disk at `disk`, written whole or not at all.
fn build_disk(image: &Image, name: &str, disk: &Path) -> Result<(), ContainerError> {
    image.verify_layers(name)?;
    make_disk(name, image.layer_count(), disk, |tree| {
        for index in 0..image.layer_count() {
            tree.apply(index + 1, image.layer(index)?)?;
        }
        Ok(())
    })
}

/// Makes the disk at `disk` of the tree `layers` layers build (`apply`
/// applies them), written whole or not at all.
fn make_disk(
    name: &str,
    layers: usize,
    disk: &Path,
    apply: impl FnOnce(&mut flatten::Tree) -> Result<(), ContainerError>,
) -> Result<(), ContainerError> {
    let started = Instant::now();
    notice!(
        "making a disk of {name} ({layers} layer{}), once: it is kept in provm's cache",
        if layers == 1 { "" } else { "s" }
    );
    let dir = disk.parent().expect("the cache file is in a directory");
    let write_error = |source| ContainerError::Write {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(write_error)?;
    let scratch = tempfile::Builder::new()
        .prefix(".making-")
        .tempdir_in(dir)
        .map_err(write_error)?;
    let staging = scratch.path().join("root");
    std::fs::create_dir(&staging).map_err(write_error)?;
    let mut tree = flatten::Tree::new(&staging);
    apply(&mut tree)?;
    let built = scratch.path().join("disk.ext4");
    ext4::build(&tree, scratch.path(), &built, ext4::FREE_BYTES)?;
    std::fs::File::open(&built)
        .and_then(|file| file.sync_all())
        .and_then(|()| std::fs::rename(&built, disk))
        .map_err(write_error)?;
    notice!(
        "made {} in {:.1} s",
        disk.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn config_of(image: &Image) -> ContainerConfig {
    let Some(config) = image.config.config() else {
        return ContainerConfig::default();
    };
    let non_empty = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());
    let mut command = config.entrypoint().clone().unwrap_or_default();
    command.extend(config.cmd().clone().unwrap_or_default());
    ContainerConfig {
        env: config.env().clone().unwrap_or_default(),
        working_dir: non_empty(config.working_dir()),
        user: non_empty(config.user()),
        command,
    }
}
