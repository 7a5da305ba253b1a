//! The input disk: large `--input`s as one read-only ext4 file system,
//! each input under its index (`0`, `1`, ...: a folder, or the file
//! itself), made by the container images' builder (`image::ext4`), so the
//! same inputs make the same bytes on any host. Every entry is root's, of
//! provm's pinned time, with the input's permission bits.
//!
//! Built once per content: cached as `inputs/KEY.ext4`, KEY a digest of
//! the inputs' digests (which the manifest records too), so an unchanged
//! input is neither built nor stored twice, and a replay finds the disk
//! its recording made, or extracts the trace's copy there once. The disk
//! is digested whenever it is used (`file_sha256`, cached while the file
//! is unchanged) and checked against the manifest's digest.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Instant;

use provm_trace::manifest::DataDigest;
use provm_trace::reader::Trace;

use super::inputs::{InputPlan, Planned};
use super::DataError;
use crate::digest::{bytes_sha256, file_sha256, HashingWriter};
use crate::image::flatten::{Kind, Node, Tree};
use crate::image::{ext4, ContainerError};
use crate::kernel::cache_dir;
use crate::notice;

/// The zstd level the trace's copy is compressed at: fast, as the image
/// is mostly the user's data, often compressed already.
const EMBED_LEVEL: i32 = 1;

/// A built input disk: its file in the cache and its digest.
pub struct InputDisk {
    pub path: PathBuf,
    pub digest: DataDigest,
}

fn dir() -> PathBuf {
    cache_dir().join("inputs")
}

/// Where the disk of the inputs with these survey digests is cached.
fn cached_path<'a>(input_digests: impl Iterator<Item = &'a str>) -> PathBuf {
    let mut key = String::from("provm input disk 1\n");
    for sha256 in input_digests {
        key += sha256;
        key.push('\n');
    }
    dir().join(format!("{}.ext4", &bytes_sha256(key.as_bytes())[..32]))
}

/// The image at `path`, digested, if it is there.
fn cached(path: PathBuf) -> Option<InputDisk> {
    let bytes = fs::metadata(&path).ok()?.len();
    let sha256 = file_sha256(&path).ok()?;
    Some(InputDisk {
        path,
        digest: DataDigest { sha256, bytes },
    })
}

/// The input disk of `plan`'s trees, if they go by disk: from the cache,
/// or built now (and each input checked unchanged since its survey).
pub fn build(plan: &InputPlan) -> Result<Option<InputDisk>, DataError> {
    if !plan.by_disk() {
        return Ok(None);
    }
    let path = cached_path(plan.trees().iter().map(|tree| tree.digest.sha256.as_str()));
    if let Some(disk) = cached(path.clone()) {
        return Ok(Some(disk));
    }
    let started = Instant::now();
    let failed = |error: io::Error| DataError::InputDisk(format!("{}: {error}", dir().display()));
    fs::create_dir_all(dir()).map_err(failed)?;
    let scratch = tempfile::Builder::new()
        .prefix(".making-")
        .tempdir_in(dir())
        .map_err(failed)?;
    let staging = scratch.path().join("root");
    fs::create_dir(&staging).map_err(failed)?;
    let mut tree = Tree::new(&staging);
    for (number, input) in plan.trees().iter().enumerate() {
        stage(&mut tree, Path::new(&number.to_string()), &input.entries).map_err(failed)?;
    }
    let built = scratch.path().join("inputs.ext4");
    ext4::build(&tree, scratch.path(), &built, 0).map_err(|error| {
        DataError::InputDisk(match error {
            ContainerError::Unsupported(name) => format!("{name}: rename it"),
            other => other.to_string(),
        })
    })?;
    plan.check_unchanged()?;
    fs::rename(&built, &path).map_err(failed)?;
    let disk = cached(path).ok_or_else(|| failed(io::ErrorKind::NotFound.into()))?;
    notice!(
        "made the input disk ({} MiB) in {:.1} s",
        disk.digest.bytes >> 20,
        started.elapsed().as_secs_f64()
    );
    Ok(Some(disk))
}

/// Puts one input's `entries` in the staging directory under `at`, and
/// their metadata in `tree`: files as hard links to the input's (copies
/// where a link cannot be made), so that staging costs no copy.
fn stage(tree: &mut Tree, at: &Path, entries: &[Planned]) -> io::Result<()> {
    let staged = |path: &[u8]| match path {
        [] => at.to_owned(),
        path => at.join(std::ffi::OsStr::from_bytes(path)),
    };
    for entry in entries {
        let (path, kind, mode) = match entry {
            Planned::Dir { path, mode } => {
                fs::create_dir(tree.staging().join(staged(path)))?;
                (path, Kind::Directory, *mode)
            }
            Planned::File { path, mode, source } => {
                let target = tree.staging().join(staged(path));
                if fs::hard_link(source, &target).is_err() {
                    fs::copy(source, &target)?;
                }
                (path, Kind::File, *mode)
            }
            Planned::Symlink { path, target } => {
                symlink(
                    std::ffi::OsStr::from_bytes(target),
                    tree.staging().join(staged(path)),
                )?;
                (path, Kind::Symlink, 0o777)
            }
        };
        let node = Node {
            kind,
            mode,
            uid: 0,
            gid: 0,
            mtime: ext4::FIXED_TIME,
            xattrs: Default::default(),
        };
        tree.nodes.insert(staged(path), node);
    }
    Ok(())
}

/// The input disk compressed for the trace, checked against `digest` as
/// it is read: a cached image that changed fails the recording.
pub fn embed(disk: &InputDisk) -> Result<Vec<u8>, DataError> {
    let failed = |error: io::Error| {
        DataError::InputDisk(format!("cannot embed {}: {error}", disk.path.display()))
    };
    let encoder = zstd::stream::Encoder::new(Vec::new(), EMBED_LEVEL).map_err(failed)?;
    let mut tee = HashingWriter::new(encoder);
    io::copy(&mut fs::File::open(&disk.path).map_err(failed)?, &mut tee).map_err(failed)?;
    let (encoder, read) = tee.into_parts();
    if read.sha256 != disk.digest.sha256 {
        return Err(DataError::InputDisk(format!(
            "{} changed since it was made: remove it, and record again",
            disk.path.display()
        )));
    }
    encoder.finish().map_err(failed)
}

/// The input disk a trace's guest read: from the cache, or extracted from
/// the trace (and checked against the manifest's digest) into it.
pub fn of_trace(trace: &Trace) -> Result<Option<InputDisk>, DataError> {
    let Some(digest) = &trace.manifest.input_disk else {
        return Ok(None);
    };
    let inputs = &trace.manifest.inputs;
    let path = cached_path(inputs.iter().map(|input| input.sha256.as_str()));
    if let Some(disk) = cached(path.clone()).filter(|disk| disk.digest == *digest) {
        return Ok(Some(disk));
    }
    if !trace.has_input_disk {
        return Err(DataError::InputDisk(
            "the trace names an input disk but does not hold it: the trace is incomplete".into(),
        ));
    }
    let failed = |error: io::Error| DataError::InputDisk(format!("{}: {error}", path.display()));
    fs::create_dir_all(dir()).map_err(failed)?;
    let mut out = HashingWriter::new(tempfile::NamedTempFile::new_in(dir()).map_err(failed)?);
    trace
        .extract_input_disk(&mut out)
        .map_err(|error| DataError::InputDisk(error.to_string()))?;
    let (file, extracted) = out.into_parts();
    if extracted.sha256 != digest.sha256 {
        return Err(DataError::InputDisk(
            "the trace's input disk does not have the digest its manifest records: the trace is corrupt".into(),
        ));
    }
    file.persist(&path).map_err(|error| failed(error.error))?;
    Ok(cached(path))
}
