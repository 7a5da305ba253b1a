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

use std::collections::HashMap;
use std::fs;
use std::io::{self, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Instant;

use provm_trace::manifest::DataDigest;
use provm_trace::reader::Trace;

use super::inputs::{InputPlan, Planned};
use super::DataError;
use crate::compress::compress_where_it_pays;
use crate::digest::{bytes_sha256, file_identity, file_sha256, HashingWriter};
use crate::image::flatten::{Kind, Node, Tree};
use crate::image::{ext4, ContainerError};
use crate::kernel::cache_dir;
use crate::notice;

/// How much of the disk is written at a time.
const WRITE_SIZE: usize = 4 << 20;

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
    let mut key = String::from("provm input disk 2\n");
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

/// The input disk of `plan`'s trees, if they go by disk, and their
/// digests (in `plan`): built, each file read once, digested and written
/// in one pass, then kept in the cache under those digests, or dropped for
/// the disk the cache has of them already.
///
/// Why one pass, and a disk made before the digests are known: a second
/// read of every input (a survey for the cache's key, then the build)
/// cost a pass over the data (1 GiB: 20 s on the SVM test bed). Inputs
/// whose files are as a run that read them left them (`identity`: inode,
/// size and times, as the cache of image digests trusts) are not read at
/// all when the cache has their disk; others changed in name only (a copy
/// of a folder) cost a scratch disk, dropped for the cached one.
pub fn build(plan: &mut InputPlan) -> Result<Option<InputDisk>, DataError> {
    if !plan.by_disk() {
        return Ok(None);
    }
    // Inputs unchanged since a run that digested them: their disk, if the
    // cache has it, with nothing read.
    let identity = plan.identity();
    if let Some(digests) = identity.as_deref().and_then(remembered) {
        if digests.len() == plan.trees().len() {
            let path = cached_path(digests.iter().map(|digest| digest.sha256.as_str()));
            if let Some(disk) = cached(path) {
                plan.set_digests(digests);
                return Ok(Some(disk));
            }
        }
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
    let mut placed = Vec::new();
    for (number, input) in plan.trees().iter().enumerate() {
        let at = Path::new(&number.to_string()).to_owned();
        stage(&mut tree, &at, &input.entries, &mut placed).map_err(failed)?;
    }
    let built = scratch.path().join("inputs.ext4");
    let extents = ext4::build_placed(&tree, scratch.path(), &built, &placed).map_err(|error| {
        DataError::InputDisk(match error {
            ContainerError::Unsupported(name) => format!("{name}: rename it"),
            other => other.to_string(),
        })
    })?;
    // The files' bytes, digested as they go in: the disk holds what the
    // digests (the manifest's, the cache's key) are of.
    let disk = fs::OpenOptions::new()
        .write(true)
        .open(&built)
        .map_err(failed)?;
    // Each placed file's input and path in it, in `placed`'s order (the
    // order `stage` went through them).
    let owners: Vec<(usize, Vec<u8>)> = plan
        .trees()
        .iter()
        .enumerate()
        .flat_map(|(index, tree)| {
            tree.entries.iter().filter_map(move |entry| match entry {
                Planned::File { path, .. } => Some((index, path.clone())),
                _ => None,
            })
        })
        .collect();
    let files: HashMap<(usize, &[u8]), usize> = owners
        .iter()
        .enumerate()
        .map(|(position, (index, path))| ((*index, path.as_slice()), position))
        .collect();
    let mut written = vec![0u64; placed.len()];
    // Writes that follow one another go out as one: under emulation each
    // write costs more than its copy.
    let mut out = io::BufWriter::with_capacity(WRITE_SIZE, &disk);
    let mut next_at = None;
    let mut write_at = |bytes: &[u8], at: u64| -> io::Result<()> {
        if next_at != Some(at) {
            out.seek(io::SeekFrom::Start(at))?;
        }
        out.write_all(bytes)?;
        next_at = Some(at + bytes.len() as u64);
        Ok(())
    };
    plan.digest_into(|index, path, data| {
        let position = files[&(index, path)];
        let offset = &mut written[position];
        let mut data = data;
        while !data.is_empty() {
            let (at, room) = extents[position]
                .iter()
                .find_map(|extent| extent.locate(*offset))
                .ok_or(io::ErrorKind::WriteZero)?;
            let len = data.len().min(room as usize);
            write_at(&data[..len], at)?;
            data = &data[len..];
            *offset += len as u64;
        }
        // The rest of the file's last block: zeros, whatever the disk held.
        let len = placed[position].1;
        if *offset == len {
            let tail = len.next_multiple_of(ext4::BLOCK) - len;
            if let Some((at, _)) = extents[position].iter().find_map(|e| e.locate(len)) {
                write_at(&vec![0; tail as usize], at)?;
            }
        }
        Ok(())
    })?;
    out.into_inner()
        .map_err(|error| failed(error.into_error()))?;
    // A file that shrank since its survey.
    for (((_, len), written), (index, _)) in placed.iter().zip(&written).zip(&owners) {
        if len != written {
            return Err(plan.changed(*index));
        }
    }
    if let Some(identity) = &identity {
        remember(identity, &plan.digests());
    }
    let path = cached_path(plan.trees().iter().map(|tree| tree.digest.sha256.as_str()));
    if let Some(disk) = cached(path.clone()) {
        // Built before: the scratch disk goes with its directory.
        return Ok(Some(disk));
    }
    disk.sync_all().map_err(failed)?;
    fs::rename(&built, &path).map_err(failed)?;
    let disk = cached(path).ok_or_else(|| failed(io::ErrorKind::NotFound.into()))?;
    notice!(
        "made the input disk ({} MiB) in {:.1} s",
        disk.digest.bytes >> 20,
        started.elapsed().as_secs_f64()
    );
    Ok(Some(disk))
}

/// Where the digests of inputs of this identity are kept.
fn remembered_path(identity: &str) -> PathBuf {
    cache_dir().join("input-identities").join(identity)
}

/// The digests of the inputs of `identity`, as a run that read them
/// remembered them: a line "SHA256 BYTES" per input.
fn remembered(identity: &str) -> Option<Vec<DataDigest>> {
    let text = fs::read_to_string(remembered_path(identity)).ok()?;
    text.lines()
        .map(|line| {
            let (sha256, bytes) = line.split_once(' ')?;
            (sha256.len() == 64).then_some(())?;
            Some(DataDigest {
                sha256: sha256.to_owned(),
                bytes: bytes.parse().ok()?,
            })
        })
        .collect()
}

fn remember(identity: &str, digests: &[DataDigest]) {
    let text: String = digests
        .iter()
        .map(|digest| format!("{} {}\n", digest.sha256, digest.bytes))
        .collect();
    // A cache that cannot be written only costs the next run a read.
    let _ = crate::digest::write_atomically(&remembered_path(identity), text.as_bytes());
}

/// Puts one input's `entries` in the staging directory under `at`, and
/// their metadata in `tree`: files empty, each added to `placed` with its
/// length (their bytes are written into the built disk).
fn stage(
    tree: &mut Tree,
    at: &Path,
    entries: &[Planned],
    placed: &mut Vec<(PathBuf, u64)>,
) -> io::Result<()> {
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
            Planned::File {
                path, mode, len, ..
            } => {
                fs::File::create(tree.staging().join(staged(path)))?;
                placed.push((staged(path), *len));
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

/// The input disk compressed for the trace (what does not compress stored
/// as it is: `compress`). Not digested again: its digest was taken when it
/// was made or found (`file_sha256`, kept while the file's identity
/// holds), so it is checked to be that file, unchanged, before and after
/// the read. A second SHA-256 of 1 GiB took 11 s on the SVM test bed.
pub fn embed(disk: &InputDisk) -> Result<Vec<u8>, DataError> {
    let failed = |error: io::Error| {
        DataError::InputDisk(format!("cannot embed {}: {error}", disk.path.display()))
    };
    let changed = || {
        DataError::InputDisk(format!(
            "{} changed since it was made: remove it, and record again",
            disk.path.display()
        ))
    };
    let identity = || fs::metadata(&disk.path).map(|meta| file_identity(&meta));
    let before = identity().map_err(failed)?;
    if file_sha256(&disk.path).map_err(failed)? != disk.digest.sha256 {
        return Err(changed());
    }
    // Compressed on the other cores, if the host has more than one.
    let others = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let mut file = fs::File::open(&disk.path).map_err(failed)?;
    let embedded = compress_where_it_pays(&mut file, EMBED_LEVEL, others as u32).map_err(failed)?;
    if identity().map_err(failed)? != before {
        return Err(changed());
    }
    Ok(embedded)
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
    let file = tempfile::NamedTempFile::new_in(dir()).map_err(failed)?;
    // The decoder's writes are of 128 KiB: gathered, as the disk's making
    // does.
    let mut out = HashingWriter::new(io::BufWriter::with_capacity(WRITE_SIZE, file));
    trace
        .extract_input_disk(&mut out)
        .map_err(|error| DataError::InputDisk(error.to_string()))?;
    let (file, extracted) = out.into_parts();
    let file = file
        .into_inner()
        .map_err(|error| failed(error.into_error()))?;
    if extracted.sha256 != digest.sha256 {
        return Err(DataError::InputDisk(
            "the trace's input disk does not have the digest its manifest records: the trace is corrupt".into(),
        ));
    }
    file.persist(&path).map_err(|error| failed(error.error))?;
    // Digested as it was extracted: not read again.
    crate::digest::remember_file_sha256(&path, &extracted.sha256);
    Ok(cached(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_is_embedded_whole_and_refused_once_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inputs.ext4");
        let mut bytes = vec![0u8; 3 << 20];
        bytes[1 << 20..].fill(0x5a);
        fs::write(&path, &bytes).unwrap();
        let disk = InputDisk {
            path: path.clone(),
            digest: DataDigest {
                sha256: bytes_sha256(&bytes),
                bytes: bytes.len() as u64,
            },
        };
        let embedded = embed(&disk).unwrap();
        assert_eq!(zstd::decode_all(&embedded[..]).unwrap(), bytes);

        // The same length, one byte other: its identity changed with it.
        bytes[5] = 1;
        fs::write(&path, &bytes).unwrap();
        let Err(refused) = embed(&disk) else {
            panic!("a changed disk is refused");
        };
        assert!(
            refused.to_string().contains("changed since it was made"),
            "{refused}"
        );
    }
}
