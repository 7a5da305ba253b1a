//! Reading a container image: which manifest a reference names, its
//! configuration and its layers, each checked against its digest. An OCI
//! layout (a directory or a tar of one) leads from `index.json` through
//! the manifest to the blobs; a docker archive has a `manifest.json` that
//! lists each image's configuration and layer files, the layers checked by
//! the configuration's `diff_ids` (the digests of the uncompressed tars).
//! oci-spec parses the OCI documents; the docker archive's `manifest.json`
//! has no crate of its own, so its three fields are read here.

use std::io::{self, BufRead, BufReader, Read};

use oci_spec::image::{
    Arch, Descriptor, Digest, DigestAlgorithm, ImageConfiguration, ImageIndex, ImageManifest,
    MediaType, Os, ANNOTATION_REF_NAME,
};
use sha2::{Digest as _, Sha256};

use super::blobs::Blobs;
use super::reference::Transport;
use super::ContainerError;

/// The media type of a docker manifest list, which an OCI layout written
/// from a docker registry may hold in place of an OCI image index.
const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// How the image is named by digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestKind {
    /// The digest of its manifest, as registries and skopeo name it.
    Manifest,
    /// A docker archive has no manifest: docker names its images by ID,
    /// the digest of their configuration.
    ImageId,
    /// A root directory a container engine unpacked (an OCI runtime
    /// bundle's) has neither: the digest of its tree, as `root_dir` reads
    /// it into a layer.
    RootDirectory,
}

impl std::fmt::Display for DigestKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DigestKind::Manifest => "manifest",
            DigestKind::ImageId => "image ID",
            DigestKind::RootDirectory => "root directory",
        })
    }
}

/// A container image, read and checked up to its layers.
pub struct Image {
    blobs: Blobs,
    /// `sha256:...`, of the kind `digest_kind` says.
    pub digest: String,
    pub digest_kind: DigestKind,
    pub config: ImageConfiguration,
    layers: Vec<Layer>,
}

struct Layer {
    /// Its file in the layout or archive.
    name: String,
    /// `sha256:...` of the file as stored (OCI), or of the tar within
    /// (docker archive: a `diff_id`).
    digest: String,
    stored_digest: bool,
}

impl Image {
    /// Reads the image `tag` names (or the only one) from `blobs`.
    pub fn read(
        transport: Transport,
        blobs: Blobs,
        image: &str,
        tag: Option<&str>,
    ) -> Result<Image, ContainerError> {
        match transport {
            Transport::Oci | Transport::OciArchive => read_oci(blobs, image, tag),
            Transport::DockerArchive => read_docker(blobs, image, tag),
        }
    }

    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Checks every layer against its digest, before any is unpacked: a
    /// corrupt layer stops the build before anything is written.
    pub fn verify_layers(&self, image: &str) -> Result<(), ContainerError> {
        for (index, layer) in self.layers.iter().enumerate() {
            let mut reader = self.blobs.open(&layer.name)?;
            if !layer.stored_digest {
                reader = decompressed(reader).map_err(layer_error(image, index))?;
            }
            let mut hasher = Sha256::new();
            io::copy(&mut reader, &mut hasher).map_err(layer_error(image, index))?;
            let found = format!("sha256:{}", provm_trace::hex(&hasher.finalize()));
            if found != layer.digest {
                return Err(ContainerError::DigestMismatch {
                    image: image.to_owned(),
                    what: format!("layer {} ({})", index + 1, layer.name),
                    expected: layer.digest.clone(),
                    found,
                });
            }
        }
        Ok(())
    }

    /// Layer `index` (from 0, the lowest) as an uncompressed tar stream.
    pub fn layer(&self, index: usize) -> Result<Box<dyn Read>, ContainerError> {
        let layer = &self.layers[index];
        decompressed(self.blobs.open(&layer.name)?).map_err(|source| ContainerError::Layer {
            layer: index + 1,
            what: source.to_string(),
        })
    }
}

fn layer_error(image: &str, index: usize) -> impl FnOnce(io::Error) -> ContainerError + '_ {
    move |source| ContainerError::Malformed {
        image: image.to_owned(),
        what: format!("cannot read layer {}: {source}", index + 1),
    }
}

/// The tar within a layer, which may be gzip- or zstd-compressed whatever
/// its media type says (docker archives name none): told by magic number.
fn decompressed(reader: Box<dyn Read>) -> io::Result<Box<dyn Read>> {
    let mut reader = BufReader::new(reader);
    let head = reader.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(reader))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(reader)?)
    } else {
        Box::new(reader)
    })
}

fn read_oci(blobs: Blobs, image: &str, tag: Option<&str>) -> Result<Image, ContainerError> {
    if !blobs.has("oci-layout") {
        return Err(ContainerError::NotALayout {
            image: image.to_owned(),
        });
    }
    let malformed = |what: String| ContainerError::Malformed {
        image: image.to_owned(),
        what,
    };
    let index = ImageIndex::from_reader(&blobs.read_small("index.json")?[..])
        .map_err(|error| malformed(format!("index.json: {error}")))?;
    let tags = |descriptors: &[Descriptor]| -> Vec<String> {
        descriptors
            .iter()
            .filter_map(ref_name)
            .map(str::to_owned)
            .collect()
    };
    let named: Vec<&Descriptor> = match tag {
        Some(tag) => index
            .manifests()
            .iter()
            .filter(|descriptor| ref_name(descriptor) == Some(tag))
            .collect(),
        None => index.manifests().iter().collect(),
    };
    let descriptor = match (named.as_slice(), tag) {
        ([], Some(tag)) => {
            return Err(ContainerError::MissingTag {
                image: image.to_owned(),
                tag: tag.to_owned(),
                available: tags(index.manifests()),
            })
        }
        ([one], _) => *one,
        (several, _) => choose_platform(image, several.iter().copied())?,
    };
    let descriptor = manifest_of(&blobs, image, descriptor)?;
    let manifest =
        ImageManifest::from_reader(&read_verified(&blobs, image, "the manifest", &descriptor)?[..])
            .map_err(|error| malformed(format!("its manifest: {error}")))?;
    let config = read_config(&blobs, image, manifest.config())?;
    let layers = manifest
        .layers()
        .iter()
        .map(|layer| {
            Ok(Layer {
                name: blob_name(image, layer.digest())?,
                digest: layer.digest().to_string(),
                stored_digest: true,
            })
        })
        .collect::<Result<_, ContainerError>>()?;
    Ok(Image {
        blobs,
        digest: descriptor.digest().to_string(),
        digest_kind: DigestKind::Manifest,
        config,
        layers,
    })
}

fn ref_name(descriptor: &Descriptor) -> Option<&str> {
    descriptor
        .annotations()
        .as_ref()?
        .get(ANNOTATION_REF_NAME)
        .map(String::as_str)
}

/// The image manifest `descriptor` leads to: itself, or, for an index of
/// images for several platforms, its linux/amd64 image's.
fn manifest_of(
    blobs: &Blobs,
    image: &str,
    descriptor: &Descriptor,
) -> Result<Descriptor, ContainerError> {
    let is_index = match descriptor.media_type() {
        MediaType::ImageIndex => true,
        MediaType::Other(other) => other == DOCKER_MANIFEST_LIST,
        _ => false,
    };
    if !is_index {
        check_platform(image, descriptor)?;
        return Ok(descriptor.clone());
    }
    let bytes = read_verified(blobs, image, "an image index", descriptor)?;
    let index = ImageIndex::from_reader(&bytes[..]).map_err(|error| ContainerError::Malformed {
        image: image.to_owned(),
        what: format!("its image index: {error}"),
    })?;
    Ok(choose_platform(image, index.manifests().iter())?.clone())
}

/// The linux/amd64 one of `descriptors`.
fn choose_platform<'a>(
    image: &str,
    descriptors: impl Iterator<Item = &'a Descriptor> + Clone,
) -> Result<&'a Descriptor, ContainerError> {
    if let Some(amd64) = descriptors.clone().find(|descriptor| {
        descriptor
            .platform()
            .as_ref()
            .is_some_and(|p| *p.architecture() == Arch::Amd64 && *p.os() == Os::Linux)
    }) {
        return Ok(amd64);
    }
    let platforms: Vec<String> = descriptors
        .map(|descriptor| match descriptor.platform() {
            Some(p) => format!("{}/{}", p.os(), p.architecture()),
            None => ref_name(descriptor).unwrap_or("untagged").to_owned(),
        })
        .collect();
    if platforms.iter().all(|p| !p.contains('/')) {
        // Several tags, no platforms: the user must name one.
        return Err(ContainerError::Ambiguous {
            image: image.to_owned(),
            available: platforms,
        });
    }
    Err(ContainerError::Architecture {
        image: image.to_owned(),
        found: platforms.join(", "),
    })
}

fn check_platform(image: &str, descriptor: &Descriptor) -> Result<(), ContainerError> {
    match descriptor.platform() {
        Some(p) if *p.architecture() != Arch::Amd64 || *p.os() != Os::Linux => {
            Err(ContainerError::Architecture {
                image: image.to_owned(),
                found: format!("{}/{}", p.os(), p.architecture()),
            })
        }
        _ => Ok(()),
    }
}

/// The configuration `descriptor` names, checked: digest and platform.
fn read_config(
    blobs: &Blobs,
    image: &str,
    descriptor: &Descriptor,
) -> Result<ImageConfiguration, ContainerError> {
    let bytes = read_verified(blobs, image, "the configuration", descriptor)?;
    parse_config(image, &bytes)
}

fn parse_config(image: &str, bytes: &[u8]) -> Result<ImageConfiguration, ContainerError> {
    let config =
        ImageConfiguration::from_reader(bytes).map_err(|error| ContainerError::Malformed {
            image: image.to_owned(),
            what: format!("its configuration: {error}"),
        })?;
    if *config.architecture() != Arch::Amd64 || *config.os() != Os::Linux {
        return Err(ContainerError::Architecture {
            image: image.to_owned(),
            found: format!("{}/{}", config.os(), config.architecture()),
        });
    }
    Ok(config)
}

/// The blob `descriptor` names, whole, checked against its digest.
fn read_verified(
    blobs: &Blobs,
    image: &str,
    what: &str,
    descriptor: &Descriptor,
) -> Result<Vec<u8>, ContainerError> {
    let bytes = blobs.read_small(&blob_name(image, descriptor.digest())?)?;
    check_digest(image, what, descriptor.digest().as_ref(), &bytes)?;
    Ok(bytes)
}

fn check_digest(
    image: &str,
    what: &str,
    expected: &str,
    bytes: &[u8],
) -> Result<(), ContainerError> {
    let found = sha256(bytes);
    if found != expected {
        return Err(ContainerError::DigestMismatch {
            image: image.to_owned(),
            what: what.to_owned(),
            expected: expected.to_owned(),
            found,
        });
    }
    Ok(())
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", provm_trace::hex(&Sha256::digest(bytes)))
}

/// Where a layout keeps the blob of `digest`. oci-spec has checked that a
/// SHA-256 digest is 64 hex digits, so the name stays in `blobs/sha256/`.
fn blob_name(image: &str, digest: &Digest) -> Result<String, ContainerError> {
    if *digest.algorithm() != DigestAlgorithm::Sha256 {
        return Err(ContainerError::Malformed {
            image: image.to_owned(),
            what: format!("it names a blob by {digest}; provm checks SHA-256 digests only"),
        });
    }
    Ok(format!("blobs/sha256/{}", digest.digest()))
}

/// One image of a docker archive's `manifest.json`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// A docker image name in full, as docker compares names: `busybox:1`
/// is `docker.io/library/busybox:1`, `me/tool:1` is `docker.io/me/tool:1`
/// (docker writes the short form, skopeo the long one). By hand: the
/// rule is these few lines, and the reference crates bring a registry
/// client along.
fn fully_qualified(name: &str) -> String {
    let registry = name
        .split_once('/')
        .map(|(first, _)| first)
        .filter(|first| first.contains(['.', ':']) || *first == "localhost");
    match (registry, name.contains('/')) {
        (Some(_), _) => name.to_owned(),
        (None, true) => format!("docker.io/{name}"),
        (None, false) => format!("docker.io/library/{name}"),
    }
}

fn read_docker(blobs: Blobs, image: &str, tag: Option<&str>) -> Result<Image, ContainerError> {
    let malformed = |what: String| ContainerError::Malformed {
        image: image.to_owned(),
        what,
    };
    if !blobs.has("manifest.json") {
        return Err(malformed(
            "it has no manifest.json: it is not what `docker save` writes".into(),
        ));
    }
    let entries: Vec<DockerEntry> = serde_json::from_slice(&blobs.read_small("manifest.json")?)
        .map_err(|error| malformed(format!("manifest.json: {error}")))?;
    let tags_of = |entry: &DockerEntry| entry.repo_tags.clone().unwrap_or_default();
    let entry = match tag {
        Some(tag) => entries
            .iter()
            .find(|entry| {
                tags_of(entry)
                    .iter()
                    .any(|t| fully_qualified(t) == fully_qualified(tag))
            })
            .ok_or_else(|| ContainerError::MissingTag {
                image: image.to_owned(),
                tag: tag.to_owned(),
                available: entries.iter().flat_map(tags_of).collect(),
            })?,
        None => match entries.as_slice() {
            [one] => one,
            several => {
                return Err(ContainerError::Ambiguous {
                    image: image.to_owned(),
                    available: several.iter().flat_map(tags_of).collect(),
                })
            }
        },
    };
    let bytes = blobs.read_small(&entry.config)?;
    let digest = sha256(&bytes);
    // `docker save` names the configuration by its digest (ID.json, or
    // blobs/sha256/ID since Docker 25): a name that says so is checked.
    let named = entry.config.rsplit('/').next().unwrap_or_default();
    let named = named.strip_suffix(".json").unwrap_or(named);
    if named.len() == 64 && named.bytes().all(|b| b.is_ascii_hexdigit()) {
        check_digest(
            image,
            "the configuration",
            &format!("sha256:{named}"),
            &bytes,
        )?;
    }
    let config = parse_config(image, &bytes)?;
    let diff_ids = config.rootfs().diff_ids();
    if diff_ids.len() != entry.layers.len() {
        return Err(malformed(format!(
            "its configuration lists {} layers and manifest.json {}",
            diff_ids.len(),
            entry.layers.len()
        )));
    }
    let layers = entry
        .layers
        .iter()
        .zip(diff_ids)
        .map(|(name, diff_id)| Layer {
            name: name.clone(),
            digest: diff_id.clone(),
            stored_digest: false,
        })
        .collect();
    Ok(Image {
        blobs,
        digest,
        digest_kind: DigestKind::ImageId,
        config,
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::fully_qualified;

    #[test]
    fn docker_names_compare_in_full() {
        assert_eq!(fully_qualified("busybox:1"), "docker.io/library/busybox:1");
        assert_eq!(fully_qualified("me/tool:1"), "docker.io/me/tool:1");
        assert_eq!(
            fully_qualified("docker.io/me/tool:1"),
            "docker.io/me/tool:1"
        );
        assert_eq!(
            fully_qualified("localhost:5000/tool:1"),
            "localhost:5000/tool:1"
        );
        assert_eq!(fully_qualified("localhost/tool:1"), "localhost/tool:1");
    }
}
