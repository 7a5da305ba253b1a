//! Writing an OCI image layout (`oci-layout`, `index.json` and the blobs),
//! as a directory or a tar (`oci-archive:`): `provm export oci`'s archive,
//! and the images the tests build. oci-spec writes the documents.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::str::FromStr;

use oci_spec::image::{
    Arch, Config, Descriptor, DescriptorBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, Os, RootFsBuilder, Sha256Digest, ANNOTATION_REF_NAME,
};
use oci_spec::OciSpecError;
use sha2::{Digest, Sha256};

/// An image layout's files, by path within the layout.
pub struct Layout {
    files: Vec<(String, Vec<u8>)>,
    manifest_digest: String,
}

impl Layout {
    /// The layout of one image for `architecture` (Linux) of `layers`
    /// (uncompressed tars, the lowest first) with the configuration
    /// `config`, tagged `tag`.
    pub fn new(
        architecture: Arch,
        config: Config,
        layers: Vec<Vec<u8>>,
        tag: &str,
    ) -> Result<Layout, OciSpecError> {
        let mut blobs = Vec::new();
        let layers: Vec<Descriptor> = layers
            .into_iter()
            .map(|layer| blob(&mut blobs, MediaType::ImageLayer, layer))
            .collect();
        let diff_ids = layers
            .iter()
            .map(|l| l.digest().to_string())
            .collect::<Vec<_>>();
        let config = ImageConfigurationBuilder::default()
            .architecture(architecture)
            .os(Os::Linux)
            .config(config)
            .rootfs(RootFsBuilder::default().diff_ids(diff_ids).build()?)
            .build()?;
        let config = blob(
            &mut blobs,
            MediaType::ImageConfig,
            config.to_string()?.into_bytes(),
        );
        let manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(config)
            .layers(layers)
            .build()?;
        let manifest = blob(
            &mut blobs,
            MediaType::ImageManifest,
            manifest.to_string()?.into_bytes(),
        );
        let manifest_digest = manifest.digest().to_string();
        let tagged = DescriptorBuilder::default()
            .media_type(MediaType::ImageManifest)
            .size(manifest.size())
            .digest(manifest.digest().clone())
            .annotations(HashMap::from([(
                ANNOTATION_REF_NAME.to_owned(),
                tag.to_owned(),
            )]))
            .build()?;
        let index = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![tagged])
            .build()?;
        let mut files = vec![
            (
                "oci-layout".to_owned(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ),
            ("index.json".to_owned(), index.to_string()?.into_bytes()),
        ];
        files.extend(blobs);
        Ok(Layout {
            files,
            manifest_digest,
        })
    }

    /// `sha256:...` of the image's manifest.
    pub fn manifest_digest(&self) -> &str {
        &self.manifest_digest
    }

    /// The layout in a tar, every entry's time and owner zero.
    pub fn tar(&self) -> io::Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, content) in &self.files {
            let mut header = tar::Header::new_ustar();
            header.set_mode(0o644);
            header.set_size(content.len() as u64);
            tar.append_data(&mut header, name, content.as_slice())?;
        }
        tar.into_inner()
    }

    /// Writes the layout into the directory `dir`.
    pub fn write_dir(&self, dir: &Path) -> io::Result<()> {
        for (name, content) in &self.files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().expect("a file in the layout"))?;
            std::fs::write(path, content)?;
        }
        Ok(())
    }
}

/// Adds `content` to `blobs`; its descriptor.
fn blob(blobs: &mut Vec<(String, Vec<u8>)>, media_type: MediaType, content: Vec<u8>) -> Descriptor {
    let digest = provm_trace::hex(&Sha256::digest(&content));
    let descriptor = Descriptor::new(
        media_type,
        content.len() as u64,
        Sha256Digest::from_str(&digest).expect("SHA-256 in hex is a digest"),
    );
    blobs.push((format!("blobs/sha256/{digest}"), content));
    descriptor
}

/// A layer's tar, entry by entry, every entry at one time and, unless
/// said, owned by root: `provm export oci`'s layer, and the tests' layers.
pub struct LayerWriter {
    tar: tar::Builder<Vec<u8>>,
    mtime: u64,
}

/// An entry's owner and extended attributes.
pub struct Attributes<'a> {
    pub uid: u64,
    pub gid: u64,
    pub xattrs: &'a [(&'a str, &'a [u8])],
}

/// Owned by root, no extended attributes.
pub const ROOT: Attributes<'static> = Attributes {
    uid: 0,
    gid: 0,
    xattrs: &[],
};

impl LayerWriter {
    /// A layer whose entries all have the modification time `mtime`.
    pub fn new(mtime: u64) -> LayerWriter {
        LayerWriter {
            tar: tar::Builder::new(Vec::new()),
            mtime,
        }
    }

    fn header(
        &mut self,
        kind: tar::EntryType,
        mode: u32,
        attributes: &Attributes,
    ) -> io::Result<tar::Header> {
        if !attributes.xattrs.is_empty() {
            let records = attributes
                .xattrs
                .iter()
                .map(|(name, value)| (format!("SCHILY.xattr.{name}"), *value))
                .collect::<Vec<_>>();
            self.tar
                .append_pax_extensions(records.iter().map(|(key, value)| (key.as_str(), *value)))?;
        }
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_mtime(self.mtime);
        header.set_uid(attributes.uid);
        header.set_gid(attributes.gid);
        header.set_size(0);
        Ok(header)
    }

    pub fn directory(&mut self, path: &str, mode: u32) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Directory, mode, &ROOT)?;
        self.tar
            .append_data(&mut header, format!("{path}/"), io::empty())
    }

    pub fn file(&mut self, path: &str, mode: u32, content: &[u8]) -> io::Result<()> {
        self.file_with(path, mode, &ROOT, content)
    }

    pub fn file_with(
        &mut self,
        path: &str,
        mode: u32,
        attributes: &Attributes,
        content: &[u8],
    ) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Regular, mode, attributes)?;
        header.set_size(content.len() as u64);
        self.tar.append_data(&mut header, path, content)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Symlink, 0o777, &ROOT)?;
        self.tar.append_link(&mut header, path, target)
    }

    /// `path` as another name of the layer's `target` (a path from the
    /// layer's root).
    pub fn hard_link(&mut self, path: &str, target: &str) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Link, 0o644, &ROOT)?;
        self.tar.append_link(&mut header, path, target)
    }

    pub fn char_device(&mut self, path: &str, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        let mut header = self.header(tar::EntryType::Char, mode, &ROOT)?;
        header.set_device_major(major)?;
        header.set_device_minor(minor)?;
        self.tar.append_data(&mut header, path, io::empty())
    }

    /// `.wh.NAME`: `path` deleted from the layers below.
    pub fn whiteout(&mut self, path: &str) -> io::Result<()> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let whiteout = format!("{dir}/.wh.{name}");
        self.file(whiteout.trim_start_matches('/'), 0o644, b"")
    }

    /// `.wh..wh..opq`: what the layers below have in `dir` hidden.
    pub fn opaque(&mut self, dir: &str) -> io::Result<()> {
        self.file(&format!("{dir}/.wh..wh..opq"), 0o644, b"")
    }

    pub fn finish(self) -> io::Result<Vec<u8>> {
        self.tar.into_inner()
    }
}
