//! A root file system given as a directory (an OCI runtime bundle's
//! `root.path`, which a container engine has already unpacked) made into
//! a disk the way a container image is: the directory is read into one
//! tar layer, in sorted order, with each entry's owner, mode and time; the
//! layer's digest names the disk in provm's cache, and the same flattening
//! and ext4 builder make it. The same tree always gives the same disk, and
//! shares its booted guest's snapshot; the directory is only read.
//!
//! Directories and symbolic links get provm's fixed time instead of
//! theirs: an engine adds an entry or two to the root it unpacks for each
//! container (Podman its /etc/mtab link), which changes the times of the
//! directories holding them, and would make every container's root a new
//! disk that boots anew. So do the empty files an engine makes in each
//! container's root as mount points or markers (Docker's /etc/hosts and
//! /.dockerenv), which the caller names. Any other file's time is kept.
//!
//! Reading the whole tree for its digest took 0.42 s of every container on
//! a 150 MB Debian root (benches/runtime.sh). So the tree's identity, what
//! its entries' metadata says without reading a file (the files' inodes,
//! sizes and times, `digest::identity_on_its_device`: not their device,
//! for each container's overlay mount of the same image is a device of
//! its own), is kept with the digest it was read to, and a tree of that
//! identity is not read again.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::ext4::FIXED_TIME;
use super::{make_disk, ContainerError, DISK_FORMAT};
use crate::digest::{identity_on_its_device, write_atomically, HashingWriter};
use crate::kernel::cache_dir;

/// A root directory as a disk: the disk, and `sha256:` of the directory's
/// layer (what names its content).
#[derive(Clone, Debug)]
pub struct RootDisk {
    pub disk: PathBuf,
    pub digest: String,
}

/// The disk of the root directory `dir`, made unless provm's cache has it;
/// `placeholders` (paths relative to `dir`) are the engine's empty files.
pub fn resolve(dir: &Path, placeholders: &[PathBuf]) -> Result<RootDisk, ContainerError> {
    resolve_in(dir, placeholders, &cache_dir().join("container-disks"))
}

fn resolve_in(
    dir: &Path,
    placeholders: &[PathBuf],
    cache: &Path,
) -> Result<RootDisk, ContainerError> {
    let write_error = |source| ContainerError::Write {
        path: cache.to_owned(),
        source,
    };
    let started = Instant::now();
    if !dir.is_dir() {
        return Err(ContainerError::NotADirectory {
            image: dir.display().to_string(),
        });
    }
    fs::create_dir_all(cache).map_err(write_error)?;
    let found = |sha256: &str, how: &str| {
        tracing::debug!(
            phase = "root disk",
            ms = started.elapsed().as_millis() as u64,
            how,
            "the root directory's disk"
        );
        RootDisk {
            disk: disk_path(cache, sha256),
            digest: format!("sha256:{sha256}"),
        }
    };
    let identity = tree_identity(dir, placeholders).ok();
    if let Some(sha256) = identity.as_deref().and_then(|id| remembered(cache, id)) {
        if disk_path(cache, &sha256).exists() {
            return Ok(found(&sha256, "cached, the root known by its identity"));
        }
    }
    let layer = tempfile::Builder::new()
        .prefix(".root-layer-")
        .tempfile_in(cache)
        .map_err(write_error)?;
    let sha256 =
        write_layer(dir, placeholders, layer.as_file()).map_err(|source| ContainerError::Read {
            path: dir.to_owned(),
            source,
        })?;
    let disk = disk_path(cache, &sha256);
    let cached = disk.exists();
    if !cached {
        make_disk(&dir.display().to_string(), 1, &disk, |tree| {
            let layer = File::open(layer.path()).map_err(write_error)?;
            tree.apply(1, io::BufReader::new(layer))
        })?;
    }
    if let Some(identity) = identity {
        remember(cache, &identity, &sha256);
    }
    Ok(found(
        &sha256,
        if cached {
            "cached, the root read"
        } else {
            "made"
        },
    ))
}

/// The disk of the root whose layer has `sha256`, in `cache`.
fn disk_path(cache: &Path, sha256: &str) -> PathBuf {
    cache.join(format!("{DISK_FORMAT}-root-{sha256}.ext4"))
}

/// Writes the tree under `dir` as a tar to `file`; returns its SHA-256.
fn write_layer(dir: &Path, placeholders: &[PathBuf], file: &File) -> io::Result<String> {
    let mut builder = tar::Builder::new(HashingWriter::new(BufWriter::new(file)));
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    for relative in sorted_entries(dir)? {
        let path = dir.join(&relative);
        let meta = fs::symlink_metadata(&path)?;
        let mut header = tar::Header::new_gnu();
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
        header.set_mtime(FIXED_TIME);
        let placeholder = meta.is_file() && meta.len() == 0 && placeholders.contains(&relative);
        if meta.is_dir() || placeholder {
            builder.append_data(&mut header, &relative, io::empty())?;
        } else if meta.file_type().is_symlink() {
            builder.append_link(&mut header, &relative, fs::read_link(&path)?)?;
        } else if is_special(&meta) {
            // The tar crate's own append of a device node or a FIFO names
            // it by its host path, absolute, which it then refuses.
            use std::os::unix::fs::MetadataExt;
            header.set_device_major(libc::major(meta.rdev()))?;
            header.set_device_minor(libc::minor(meta.rdev()))?;
            builder.append_data(&mut header, &relative, io::empty())?;
        } else {
            builder.append_path_with_name(&path, &relative)?;
        }
    }
    let (mut writer, digested) = builder.into_inner()?.into_parts();
    writer.flush()?;
    Ok(digested.sha256)
}

/// What identifies the tree under `dir` as the layer holds it, without
/// reading a file: each entry's path, kind, owner and mode, a link's
/// target, a device's number, and a file's inode, size and times (a
/// placeholder's and a directory's times excepted, as the layer's are).
fn tree_identity(dir: &Path, placeholders: &[PathBuf]) -> io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let mut hasher = Sha256::new();
    hasher.update(format!("provm root identity 1 {DISK_FORMAT}\n"));
    for relative in sorted_entries(dir)? {
        let path = dir.join(&relative);
        let meta = fs::symlink_metadata(&path)?;
        let placeholder = meta.is_file() && meta.len() == 0 && placeholders.contains(&relative);
        let what = if meta.is_dir() || placeholder {
            String::new()
        } else if meta.file_type().is_symlink() {
            format!("-> {}", fs::read_link(&path)?.display())
        } else if is_special(&meta) {
            format!("device {}", meta.rdev())
        } else {
            // Less the device (see the module's header).
            identity_on_its_device(&meta)
        };
        let line = format!(
            "{} {:o} {}:{} {what}",
            relative.display(),
            meta.mode(),
            meta.uid(),
            meta.gid()
        );
        hasher.update((line.len() as u64).to_le_bytes());
        hasher.update(line.as_bytes());
    }
    Ok(provm_trace::hex(&hasher.finalize()))
}

/// Where the digest a tree of `identity` was read to is kept.
fn remembered_path(cache: &Path, identity: &str) -> PathBuf {
    cache.join("identities").join(identity)
}

/// The layer digest a tree of `identity` was read to, if one was.
fn remembered(cache: &Path, identity: &str) -> Option<String> {
    let sha256 = fs::read_to_string(remembered_path(cache, identity)).ok()?;
    (sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit())).then_some(sha256)
}

fn remember(cache: &Path, identity: &str, sha256: &str) {
    // A cache that cannot be written only costs the next container a read.
    let _ = write_atomically(&remembered_path(cache, identity), sha256.as_bytes());
}

/// A device node or a FIFO: an entry with no content.
fn is_special(meta: &fs::Metadata) -> bool {
    let kind = meta.file_type();
    kind.is_char_device() || kind.is_block_device() || kind.is_fifo()
}

/// Every entry under `dir`, relative to it, each directory before what it
/// holds and names sorted, so that the layer's bytes depend on the tree
/// only. Sockets are left out: they have no content, and a tar has no
/// place for them.
fn sorted_entries(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let mut names: Vec<_> = fs::read_dir(dir.join(&relative))?
            .map(|entry| entry.map(|entry| (entry.file_name(), entry.file_type())))
            .collect::<io::Result<_>>()?;
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let mut directories = Vec::new();
        for (name, kind) in names {
            let kind = kind?;
            if kind.is_socket() {
                continue;
            }
            let path = relative.join(name);
            found.push(path.clone());
            if kind.is_dir() {
                directories.push(path);
            }
        }
        // Popped in name order.
        pending.extend(directories.into_iter().rev());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree whose identity is known is not read again: its remembered
    /// digest names the disk (here one planted for the test, which the
    /// tree's own content would not name). A directory's time and a
    /// placeholder made anew leave the identity; a file written changes it.
    #[test]
    fn a_tree_of_a_known_identity_is_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/file"), b"one\n").unwrap();
        fs::write(root.join("etc/hosts"), b"").unwrap();
        let placeholders = [PathBuf::from("etc/hosts")];
        let cache = dir.path().join("cache");
        let read = resolve_in(&root, &placeholders, &cache).unwrap();
        let identity = tree_identity(&root, &placeholders).unwrap();
        let planted = "ab".repeat(32);
        remember(&cache, &identity, &planted);
        fs::copy(&read.disk, disk_path(&cache, &planted)).unwrap();
        assert_eq!(
            resolve_in(&root, &placeholders, &cache).unwrap().digest,
            format!("sha256:{planted}")
        );

        fs::remove_file(root.join("etc/hosts")).unwrap();
        fs::write(root.join("etc/hosts"), b"").unwrap();
        let day_one = std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
        File::open(root.join("etc"))
            .unwrap()
            .set_modified(day_one)
            .unwrap();
        assert_eq!(tree_identity(&root, &placeholders).unwrap(), identity);
        fs::write(root.join("etc/file"), b"two\n").unwrap();
        assert_ne!(tree_identity(&root, &placeholders).unwrap(), identity);
        assert_ne!(
            resolve_in(&root, &placeholders, &cache).unwrap().digest,
            format!("sha256:{planted}")
        );
    }

    /// The same tree makes the same disk, found in the cache the second
    /// time; a changed file makes another.
    #[test]
    fn a_root_directory_is_made_into_a_disk_named_by_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        fs::create_dir_all(root.join("etc/deep")).unwrap();
        fs::write(root.join("etc/deep/file"), b"one\n").unwrap();
        std::os::unix::fs::symlink("deep/file", root.join("etc/link")).unwrap();
        let cache = dir.path().join("cache");
        let first = resolve_in(&root, &[], &cache).unwrap();
        assert!(first.disk.exists());
        let again = resolve_in(&root, &[], &cache).unwrap();
        assert_eq!(again.digest, first.digest);
        assert_eq!(again.disk, first.disk);
        // A directory's time is not the disk's.
        fs::write(root.join("etc/added-by-an-engine"), b"").unwrap();
        fs::remove_file(root.join("etc/added-by-an-engine")).unwrap();
        let day_one = std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
        File::open(root.join("etc"))
            .unwrap()
            .set_modified(day_one)
            .unwrap();
        assert_eq!(resolve_in(&root, &[], &cache).unwrap().digest, first.digest);
        // Nor is an engine's empty placeholder's, but any other file's is.
        let hosts = PathBuf::from("etc/hosts");
        fs::write(root.join(&hosts), b"").unwrap();
        let placeholders = [hosts.clone()];
        let with_hosts = resolve_in(&root, &placeholders, &cache).unwrap().digest;
        File::options()
            .write(true)
            .open(root.join(&hosts))
            .unwrap()
            .set_modified(day_one)
            .unwrap();
        assert_eq!(
            resolve_in(&root, &placeholders, &cache).unwrap().digest,
            with_hosts
        );
        assert_ne!(resolve_in(&root, &[], &cache).unwrap().digest, with_hosts);
        fs::remove_file(root.join(&hosts)).unwrap();
        fs::write(root.join("etc/deep/file"), b"two\n").unwrap();
        let changed = resolve_in(&root, &[], &cache).unwrap();
        assert_ne!(changed.digest, first.digest);
        let listing = std::process::Command::new("debugfs")
            .arg("-R")
            .arg("cat /etc/deep/file")
            .arg(&changed.disk)
            .output()
            .unwrap();
        assert_eq!(listing.stdout, b"two\n");
        // No layer left behind in the cache.
        let left: Vec<_> = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|name| name.to_string_lossy().starts_with(".root-layer-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// A FIFO, as a device node (an image's /dev/null), is an entry of the
    /// disk, as the tree has it.
    #[test]
    fn a_fifo_in_the_root_is_made_into_one_on_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        fs::create_dir_all(root.join("srv")).unwrap();
        let fifo = std::ffi::CString::new(root.join("srv/fifo").to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated name, which outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
        let made = resolve_in(&root, &[], &dir.path().join("cache")).unwrap();
        let shown = std::process::Command::new("debugfs")
            .arg("-R")
            .arg("stat /srv/fifo")
            .arg(&made.disk)
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.contains("Type: FIFO"), "{shown}");
    }

    #[test]
    fn entries_are_listed_parents_first_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for path in ["b/z", "b/a", "a", "c"] {
            fs::create_dir_all(dir.path().join(path)).unwrap();
        }
        let entries = sorted_entries(dir.path()).unwrap();
        let names: Vec<_> = entries.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(names, ["a", "b", "c", "b/a", "b/z"]);
    }
}
