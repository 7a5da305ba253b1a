//! What a trace says of the recording host's files. A trace is published
//! with a paper, so by default it names the host's files (the image, its
//! backing files, the kernel, a forked trace) by file name and digest only:
//! an absolute path would carry its author's user name and directory
//! layout. `provm record --keep-host-paths` keeps the paths for authors who
//! want them.

use std::path::{Path, PathBuf};

use provm_trace::manifest::{ContainerImage, ImageFile, ImageIdentity};

use crate::image::Container;

/// How a trace names a file of the recording host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostPaths {
    /// By its file name alone (the default).
    #[default]
    FileNames,
    /// By its path, as given or as the qcow2 headers named it.
    Kept,
}

impl HostPaths {
    /// `path` as the trace names it.
    pub fn name(self, path: &Path) -> String {
        match self {
            HostPaths::Kept => path.display().to_string(),
            HostPaths::FileNames => file_name(path),
        }
    }

    /// The image's identity as the trace records it: `image` the disk the
    /// guest booted, `chain` its files as identified on this host, and
    /// the container image the disk was made of, if it was.
    pub fn image_identity(
        self,
        image: &Path,
        chain: &[ImageFile],
        container: Option<&Container>,
    ) -> ImageIdentity {
        ImageIdentity {
            path: self.name(image),
            chain: self.chain(chain),
            container: container.map(|container| ContainerImage {
                reference: container
                    .reference
                    .with_path(PathBuf::from(self.name(container.reference.path())))
                    .to_string(),
                digest: container.digest.clone(),
                digest_of: container.digest_kind.to_string(),
            }),
        }
    }

    /// The image's files as the trace records them.
    pub fn chain(self, chain: &[ImageFile]) -> Vec<ImageFile> {
        chain
            .iter()
            .map(|file| ImageFile {
                path: self.name(Path::new(&file.path)),
                ..file.clone()
            })
            .collect()
    }
}

/// The last component of `path` (the whole of it if it has none, as `/`).
pub fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |name| name.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, depth: u32) -> ImageFile {
        ImageFile {
            path: path.into(),
            depth,
            role: "image".into(),
            size: 7,
            sha256: format!("{depth:064}"),
        }
    }

    #[test]
    fn the_image_and_its_backing_files_are_named_by_file_name_unless_kept() {
        let chain = [
            file("/home/alice/vms/top.qcow2", 0),
            file("/srv/base.raw", 1),
        ];
        let image = Path::new("/home/alice/vms/top.qcow2");
        let named = HostPaths::FileNames.image_identity(image, &chain, None);
        assert_eq!(named.path, "top.qcow2");
        assert_eq!(named.chain[0].path, "top.qcow2");
        assert_eq!(named.chain[1].path, "base.raw");
        assert_eq!(named.chain[1].sha256, chain[1].sha256);
        assert_eq!(named.chain[1].depth, 1);

        let kept = HostPaths::Kept.image_identity(image, &chain, None);
        assert_eq!(kept.path, "/home/alice/vms/top.qcow2");
        assert_eq!(kept.chain, chain);
    }

    #[test]
    fn a_container_image_is_named_by_its_file_name_unless_kept() {
        let container = Container {
            reference: crate::image::ImageRef::parse("oci-archive:/home/alice/py.tar:3.12"),
            digest: format!("sha256:{}", "a".repeat(64)),
            digest_kind: crate::image::DigestKind::Manifest,
            config: Default::default(),
        };
        let disk = Path::new("/home/alice/.cache/provm/container-disks/v1-a.ext4");
        let named = HostPaths::FileNames.image_identity(disk, &[], Some(&container));
        let recorded = named.container.unwrap();
        assert_eq!(recorded.reference, "oci-archive:py.tar:3.12");
        assert_eq!(recorded.digest, container.digest);
        assert_eq!(recorded.digest_of, "manifest");
        assert_eq!(named.path, "v1-a.ext4");
        let kept = HostPaths::Kept.image_identity(disk, &[], Some(&container));
        assert_eq!(
            kept.container.unwrap().reference,
            "oci-archive:/home/alice/py.tar:3.12"
        );
    }

    #[test]
    fn a_relative_path_keeps_only_its_name() {
        assert_eq!(
            HostPaths::FileNames.name(Path::new("vms/a.qcow2")),
            "a.qcow2"
        );
        assert_eq!(
            HostPaths::Kept.name(Path::new("vms/a.qcow2")),
            "vms/a.qcow2"
        );
    }
}
