//! An image as the command line names it: a disk image's path, or a
//! container image in one of the forms skopeo names them (containers-
//! transports(5)): `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]` and
//! `docker-archive:FILE[:NAME:TAG]`. As in skopeo, the path ends at its
//! first colon.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a container image is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// An OCI image layout: a directory.
    Oci,
    /// An OCI image layout in a tar file.
    OciArchive,
    /// What `docker save` and `podman save` write: a tar file with a
    /// `manifest.json`.
    DockerArchive,
}

impl Transport {
    const ALL: [Transport; 3] = [
        Transport::Oci,
        Transport::OciArchive,
        Transport::DockerArchive,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            Transport::Oci => "oci",
            Transport::OciArchive => "oci-archive",
            Transport::DockerArchive => "docker-archive",
        }
    }
}

/// The image argument of `run`, `record`, `repro` and `--image`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageRef {
    /// A qcow2 or raw disk image.
    Disk(PathBuf),
    /// A container image: where it is, and which one (an OCI layout's tag,
    /// a docker archive's NAME:TAG); `None`: the only one there.
    Container {
        transport: Transport,
        path: PathBuf,
        tag: Option<String>,
    },
}

impl ImageRef {
    pub fn parse(text: &str) -> ImageRef {
        for transport in Transport::ALL {
            let Some(rest) = text
                .strip_prefix(transport.prefix())
                .and_then(|rest| rest.strip_prefix(':'))
            else {
                continue;
            };
            let (path, tag) = match rest.split_once(':') {
                Some((path, tag)) if !tag.is_empty() => (path, Some(tag.to_owned())),
                Some((path, _)) => (path, None),
                None => (rest, None),
            };
            // `docker save` tags a bare NAME as NAME:latest, so `docker
            // load` does, and so does this.
            let tag = match (transport, tag) {
                (Transport::DockerArchive, Some(name)) if !name.contains(':') => {
                    Some(format!("{name}:latest"))
                }
                (_, tag) => tag,
            };
            return ImageRef::Container {
                transport,
                path: PathBuf::from(path),
                tag,
            };
        }
        ImageRef::Disk(PathBuf::from(text))
    }

    /// The file or directory the image is read from.
    pub fn path(&self) -> &Path {
        match self {
            ImageRef::Disk(path) | ImageRef::Container { path, .. } => path,
        }
    }

    /// The same reference with its path replaced by `path` (a trace names
    /// files by file name only; see `host_paths`).
    pub fn with_path(&self, path: PathBuf) -> ImageRef {
        match self {
            ImageRef::Disk(_) => ImageRef::Disk(path),
            ImageRef::Container { transport, tag, .. } => ImageRef::Container {
                transport: *transport,
                path,
                tag: tag.clone(),
            },
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Disk(path) => write!(f, "{}", path.display()),
            ImageRef::Container {
                transport,
                path,
                tag,
            } => {
                write!(f, "{}:{}", transport.prefix(), path.display())?;
                match tag {
                    Some(tag) => write!(f, ":{tag}"),
                    None => Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(transport: Transport, path: &str, tag: Option<&str>) -> ImageRef {
        ImageRef::Container {
            transport,
            path: path.into(),
            tag: tag.map(str::to_owned),
        }
    }

    #[test]
    fn references_are_read_as_skopeo_reads_them() {
        assert_eq!(
            ImageRef::parse("images/tiny.qcow2"),
            ImageRef::Disk("images/tiny.qcow2".into())
        );
        assert_eq!(
            ImageRef::parse("oci:/srv/layout"),
            container(Transport::Oci, "/srv/layout", None)
        );
        assert_eq!(
            ImageRef::parse("oci:layout:v1.2"),
            container(Transport::Oci, "layout", Some("v1.2"))
        );
        assert_eq!(
            ImageRef::parse("oci-archive:py.tar:3.12"),
            container(Transport::OciArchive, "py.tar", Some("3.12"))
        );
        assert_eq!(
            ImageRef::parse("docker-archive:py.tar:localhost:5000/py:3.12"),
            container(
                Transport::DockerArchive,
                "py.tar",
                Some("localhost:5000/py:3.12")
            )
        );
        assert_eq!(
            ImageRef::parse("docker-archive:py.tar:python"),
            container(Transport::DockerArchive, "py.tar", Some("python:latest"))
        );
        assert_eq!(
            ImageRef::parse("docker-archive:py.tar").to_string(),
            "docker-archive:py.tar"
        );
        assert_eq!(
            ImageRef::parse("oci-archive:py.tar:3.12").to_string(),
            "oci-archive:py.tar:3.12"
        );
    }
}
