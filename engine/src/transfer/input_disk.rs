//! The input disk: large `--input`s as one read-only ext4 file system,
//! each input under its index (`0`, `1`, ...: a folder, or the file
//! itself), made by the container images' builder (`image::ext4`), so the
//! same inputs make the same bytes on any host. Every entry is root's, of
//! provm's pinned time, with the input's permission bits.
//!
//! Made from the survey alone (`survey::Surveyed`: entries, lengths), it
//! gives back the disk and the inputs' digests, which its making takes as
//! it writes (`disk_fill`): each input is read once, as the channel would
//! send it, and nothing is asked of the plan, which is made from what the
//! builder gives.
//!
//! Built once per content: cached as `inputs/KEY.ext4`, KEY a digest of
//! the inputs' digests (which the manifest records too), so an unchanged
//! input is neither built nor stored twice, and a replay finds the disk
//! its recording made, or extracts the trace's copy there once. The disk
//! is digested whenever it is used (`file_sha256`, cached while the file
//! is unchanged) and checked against the manifest's digest.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::Instant;

use provm_trace::manifest::DataDigest;
use provm_trace::reader::Trace;

use super::disk_fill::{self, WRITE_SIZE};
use super::survey::Surveyed;
use super::{input_identity, DataError};
use crate::compress::compress_where_it_pays;
use crate::digest::{bytes_sha256, file_identity, file_sha256, HashingWriter};
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

/// Where the disk of the inputs with these digests is cached.
fn cached_path<'a>(input_digests: impl Iterator<Item = &'a str>) -> PathBuf {
    let mut key = String::from("provm input disk 2\n");
    for sha256 in input_digests {
        key += sha256;
        key.push('\n');
    }
    dir().join(format!("{}.ext4", &bytes_sha256(key.as_bytes())[..32]))
}

/// Where the disk of inputs of `digests` is cached.
fn cached_path_of(digests: &[DataDigest]) -> PathBuf {
    cached_path(digests.iter().map(|digest| digest.sha256.as_str()))
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

/// The input disk of the surveyed `trees`, and their digests (one per
/// tree, in order): built, each file read once, digested and written in
/// one pass, then kept in the cache under those digests, or dropped for
/// the disk the cache has of them already.
///
/// Why one pass, and a disk made before the digests are known: a second
/// read of every input (a survey for the cache's key, then the build)
/// cost a pass over the data (1 GiB: 20 s on the SVM test bed). Inputs
/// whose files are as a run that read them left them (`input_identity`)
/// are not read at all when the cache has their disk; others changed in
/// name only (a copy of a folder) cost a scratch disk, dropped for the
/// cached one.
pub(super) fn build(trees: &[Surveyed]) -> Result<(InputDisk, Vec<DataDigest>), DataError> {
    let identity = input_identity::identity(trees);
    if let Some(found) = identity
        .as_deref()
        .and_then(|identity| unread(identity, trees.len()))
    {
        return Ok(found);
    }
    let started = Instant::now();
    let dir = dir();
    let made = disk_fill::make(trees, &dir)?;
    let digests = made.digests;
    if let Some(identity) = &identity {
        input_identity::remember(identity, &digests);
    }
    let path = cached_path_of(&digests);
    if let Some(disk) = cached(path.clone()) {
        // Built before: the scratch disk goes with its directory.
        return Ok((disk, digests));
    }
    let failed = DataError::input_disk_at(&dir);
    made.file.sync_all().map_err(failed)?;
    fs::rename(&made.path, &path).map_err(failed)?;
    let disk = cached(path).ok_or_else(|| failed(io::ErrorKind::NotFound.into()))?;
    notice!(
        "made the input disk ({} MiB) in {:.1} s",
        disk.digest.bytes >> 20,
        started.elapsed().as_secs_f64()
    );
    Ok((disk, digests))
}

/// The disk of `inputs` inputs of `identity`, and their digests, when a
/// run remembered those and the cache has their disk: nothing read.
fn unread(identity: &str, inputs: usize) -> Option<(InputDisk, Vec<DataDigest>)> {
    let digests = input_identity::remembered(identity).filter(|digests| digests.len() == inputs)?;
    Some((cached(cached_path_of(&digests))?, digests))
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
    let failed = DataError::input_disk_at(&path);
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
