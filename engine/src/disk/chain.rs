//! The image's identity, and its copy in a trace. An image is every file it
//! reads from (the image file, its qcow2 backing images, their external data
//! files), each identified by size and SHA-256. A replay lists the files its
//! image reads now and refuses to run unless each has its recorded digest:
//! a backing file changed since the recording would otherwise replay
//! silently against different data.
//!
//! `--embed-image` stores the chain's files themselves, in chain order, as
//! one zstd stream that the manifest's sizes split again. So the embedded
//! copy is checked by the very digests the files on disk are, and it costs
//! what the chain's files cost (a flattened image would cost the whole
//! virtual disk, zeroes included, to produce). Replay extracts the files into
//! a temporary directory and opens the image with its chain relocated there.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use provm_trace::format::FormatError;
use provm_trace::manifest::{ImageFile, ImageIdentity};
use provm_trace::reader::Trace;
use provm_vmm::disk::image::{BaseImage, ChainFile, ChainRole, ImageError};

use crate::digest::file_sha256;

const IMAGE: &str = "image";
const DATA_FILE: &str = "data file";

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("cannot read the image file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("refusing to replay: {}, {}, is not the file the trace was recorded with (sha256 {}; recorded {}, from {}); pass --image with the image the trace was recorded from, its backing files unchanged", describe(found), found.path, found.sha256, recorded.sha256, recorded.path)]
    FileDiffers {
        found: Box<ImageFile>,
        recorded: Box<ImageFile>,
    },
    #[error("refusing to replay: the image {image} reads {found}; the recording read {recorded}; pass --image with the image the trace was recorded from (`qemu-img info --backing-chain IMAGE` lists its files)")]
    ChainDiffers {
        image: PathBuf,
        found: String,
        recorded: String,
    },
    #[error("the trace's manifest lists no image file: the trace is damaged")]
    NoFiles,
    #[error("cannot extract the embedded image to {path}: {source}")]
    Extract { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Trace(#[from] FormatError),
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// Every file `base` reads from, identified, in [`BaseImage::chain`]'s order.
pub fn identify(base: &BaseImage) -> Result<Vec<ImageFile>, ChainError> {
    base.chain().iter().map(identify_file).collect()
}

fn identify_file(file: &ChainFile) -> Result<ImageFile, ChainError> {
    let read_error = |source| ChainError::Read {
        path: file.path.clone(),
        source,
    };
    Ok(ImageFile {
        path: file.path.display().to_string(),
        depth: file.depth,
        role: match file.role {
            ChainRole::Image => IMAGE,
            ChainRole::DataFile => DATA_FILE,
        }
        .to_string(),
        size: fs::metadata(&file.path).map_err(read_error)?.len(),
        sha256: file_sha256(&file.path).map_err(read_error)?,
    })
}

/// A file's place in the chain, in words: `the image`, `backing file 2`,
/// `the data file of backing file 1`.
pub fn describe(file: &ImageFile) -> String {
    let image = match file.depth {
        0 => "the image".to_string(),
        depth => format!("backing file {depth}"),
    };
    if file.role == DATA_FILE {
        format!("the data file of {image}")
    } else {
        image
    }
}

/// A file's place in the chain as a name: `image`, `backing-file-2`,
/// `backing-file-1-data-file`.
pub fn role_name(file: &ImageFile) -> String {
    let image = match file.depth {
        0 => "image".to_string(),
        depth => format!("backing-file-{depth}"),
    };
    if file.role == DATA_FILE {
        format!("{image}-data-file")
    } else {
        image
    }
}

/// Checks that `base` reads exactly the files the recording read, with the
/// same contents.
pub fn check(base: &BaseImage, recorded: &ImageIdentity) -> Result<(), ChainError> {
    let found = identify(base)?;
    let places = |chain: &[ImageFile]| chain.iter().map(describe).collect::<Vec<_>>();
    if places(&found) != places(&recorded.chain) {
        let summary =
            |chain: &[ImageFile]| format!("{} file(s) ({})", chain.len(), places(chain).join(", "));
        return Err(ChainError::ChainDiffers {
            image: base.path().to_owned(),
            found: summary(&found),
            recorded: summary(&recorded.chain),
        });
    }
    match found
        .iter()
        .zip(&recorded.chain)
        .find(|(now, then)| now.sha256 != then.sha256)
    {
        Some((now, then)) => Err(ChainError::FileDiffers {
            found: Box::new(now.clone()),
            recorded: Box::new(then.clone()),
        }),
        None => Ok(()),
    }
}

/// The chain's files, one after the other in chain order, compressed at
/// zstd `level`.
pub fn embed(chain: &[ImageFile], level: i32) -> Result<Vec<u8>, ChainError> {
    let mut encoder =
        zstd::stream::Encoder::new(Vec::new(), level).expect("a valid compression level");
    for file in chain {
        let path = Path::new(&file.path);
        File::open(path)
            .and_then(|mut source| io::copy(&mut source, &mut encoder))
            .map_err(|source| ChainError::Read {
                path: path.to_owned(),
                source,
            })?;
    }
    Ok(encoder.finish().expect("compressing to memory cannot fail"))
}

/// An image's files extracted from a trace, in a temporary directory that
/// is removed when this is dropped.
pub struct ExtractedChain {
    _dir: tempfile::TempDir,
    files: Vec<PathBuf>,
}

impl ExtractedChain {
    /// Extracts the image embedded in `trace`.
    pub fn from_trace(trace: &Trace) -> Result<ExtractedChain, ChainError> {
        Self::unpack(&trace.manifest.image.chain, |out| {
            Ok(trace.extract_image(out)?)
        })
    }

    /// Creates the chain's files and splits the stream that `write_stream`
    /// writes into them.
    fn unpack(
        chain: &[ImageFile],
        write_stream: impl FnOnce(&mut SplitWriter) -> Result<(), ChainError>,
    ) -> Result<ExtractedChain, ChainError> {
        if chain.is_empty() {
            return Err(ChainError::NoFiles);
        }
        let extract_error = |path: &Path| {
            let path = path.to_owned();
            move |source| ChainError::Extract { path, source }
        };
        let dir = tempfile::tempdir().map_err(extract_error(&std::env::temp_dir()))?;
        let mut files = Vec::new();
        let mut parts = Vec::new();
        for (index, file) in chain.iter().enumerate() {
            let name = Path::new(&file.path).file_name().unwrap_or_default();
            let path = dir
                .path()
                .join(format!("{index}-{}", name.to_string_lossy()));
            parts.push((
                File::create(&path).map_err(extract_error(&path))?,
                file.size,
            ));
            files.push(path);
        }
        let mut out = SplitWriter { parts, current: 0 };
        write_stream(&mut out)?;
        out.flush().map_err(extract_error(dir.path()))?;
        Ok(ExtractedChain { _dir: dir, files })
    }

    /// Opens the extracted image, its backing chain read from the extracted
    /// files.
    pub fn open(&self) -> Result<BaseImage, ImageError> {
        let (image, dependencies) = self.files.split_first().expect("unpack checks");
        BaseImage::open_relocated(image, dependencies)
    }
}

/// Writes one stream into successive files, each up to its size. A stream
/// cut short leaves a file short, which its digest check then reports.
struct SplitWriter {
    parts: Vec<(File, u64)>,
    current: usize,
}

impl Write for SplitWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        while let Some((file, left)) = self.parts.get_mut(self.current) {
            if *left == 0 {
                self.current += 1;
                continue;
            }
            let len = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
            let written = file.write(&buf[..len])?;
            *left -= written as u64;
            return Ok(written);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the embedded image is longer than the files its manifest lists",
        ))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.parts.iter_mut().try_for_each(|(file, _)| file.flush())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_vmm::disk::Disk;
    use std::process::Command;

    const MIB: usize = 1 << 20;

    /// `top.qcow2` over `base.raw` (1 MiB of 0x11), as qemu-img makes it:
    /// the backing file named relative to the top.
    fn qemu_img_chain(dir: &Path) -> (PathBuf, PathBuf) {
        let base = dir.join("base.raw");
        fs::write(&base, vec![0x11; MIB]).unwrap();
        let output = Command::new("qemu-img")
            .current_dir(dir)
            .args(["create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw"])
            .arg("top.qcow2")
            .output()
            .expect("this test needs qemu-img: install qemu-utils");
        assert!(
            output.status.success(),
            "qemu-img: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        (dir.join("top.qcow2"), base)
    }

    fn identity(base: &BaseImage) -> ImageIdentity {
        ImageIdentity {
            path: base.path().display().to_string(),
            chain: identify(base).unwrap(),
            container: None,
        }
    }

    #[test]
    fn identity_covers_the_backing_file() {
        let dir = tempfile::tempdir().unwrap();
        let dir = fs::canonicalize(dir.path()).unwrap();
        let (top, base_file) = qemu_img_chain(&dir);
        let chain = identify(&BaseImage::open(&top).unwrap()).unwrap();
        let described: Vec<(String, String, u64)> = chain
            .iter()
            .map(|f| (describe(f), f.path.clone(), f.size))
            .collect();
        assert_eq!(
            described,
            [
                (
                    "the image".to_string(),
                    top.display().to_string(),
                    fs::metadata(&top).unwrap().len()
                ),
                (
                    "backing file 1".to_string(),
                    base_file.display().to_string(),
                    MIB as u64
                ),
            ]
        );
        assert_eq!(chain[1].sha256, crate::digest::bytes_sha256(&[0x11; MIB]));
        assert_eq!(chain[0].sha256, file_sha256(&top).unwrap());
    }

    #[test]
    fn a_changed_backing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (top, base_file) = qemu_img_chain(dir.path());
        let recorded = identity(&BaseImage::open(&top).unwrap());
        check(&BaseImage::open(&top).unwrap(), &recorded).unwrap();

        let mut bytes = fs::read(&base_file).unwrap();
        bytes[4096] ^= 1;
        fs::write(&base_file, bytes).unwrap();
        let err = check(&BaseImage::open(&top).unwrap(), &recorded).unwrap_err();
        assert!(matches!(err, ChainError::FileDiffers { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("backing file 1"), "{message}");
        assert!(message.contains("base.raw"), "{message}");
        assert!(message.contains("--image"), "{message}");
    }

    #[test]
    fn a_different_chain_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (top, base_file) = qemu_img_chain(dir.path());
        let recorded = identity(&BaseImage::open(&top).unwrap());
        let err = check(&BaseImage::open(&base_file).unwrap(), &recorded).unwrap_err();
        assert!(matches!(err, ChainError::ChainDiffers { .. }), "{err}");
        assert!(err.to_string().contains("1 file(s) (the image)"), "{err}");
    }

    #[test]
    fn embedded_chain_replays_from_its_extracted_files() {
        let dir = tempfile::tempdir().unwrap();
        let (top, _) = qemu_img_chain(dir.path());
        let recorded = identity(&BaseImage::open(&top).unwrap());
        let embedded = embed(&recorded.chain, 1).unwrap();
        // The originals are gone: only the extracted copies can serve.
        drop(dir);

        let extracted = ExtractedChain::unpack(&recorded.chain, |out| {
            zstd::stream::copy_decode(&embedded[..], out).unwrap();
            Ok(())
        })
        .unwrap();
        let mut image = extracted.open().unwrap();
        check(&image, &recorded).unwrap();
        let mut sector = [0; 512];
        image.read_at(MIB as u64 - 512, &mut sector).unwrap();
        assert_eq!(sector, [0x11; 512]);
    }

    #[test]
    fn a_stream_longer_than_the_chain_is_refused() {
        let file = ImageFile {
            path: "/images/disk.img".into(),
            depth: 0,
            role: IMAGE.into(),
            size: 4,
            sha256: String::new(),
        };
        let result = ExtractedChain::unpack(&[file], |out| {
            out.write_all(b"12345")
                .map_err(|source| ChainError::Extract {
                    path: PathBuf::new(),
                    source,
                })
        });
        let err = result.err().unwrap();
        assert!(err.to_string().contains("longer"), "{err}");
    }
}
