//! SHA-256 digests of what a run depends on and gives out. Images are
//! large, so a file's digest is cached under its identity (device, inode,
//! size, change time): a file changed in place gets a new change time.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::kernel::cache_dir;

/// What passed through a [`HashingWriter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digested {
    pub sha256: String,
    pub size: u64,
}

/// Passes bytes on to `inner` and hashes them: the command's output streams.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: io::Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }

    pub fn digested(self) -> Digested {
        self.into_parts().1
    }

    /// The writer bytes went to, and what passed.
    pub fn into_parts(self) -> (W, Digested) {
        let digested = Digested {
            sha256: provm_trace::hex(&self.hasher.finalize()),
            size: self.size,
        };
        (self.inner, digested)
    }
}

impl<W: io::Write> io::Write for HashingWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..written]);
        self.size += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

pub fn bytes_sha256(bytes: &[u8]) -> String {
    provm_trace::hex(&Sha256::digest(bytes))
}

/// What identifies a file's content without reading it: its device,
/// inode, size and modification and change times (a write changes the
/// change time, which no one can set).
pub fn file_identity(meta: &fs::Metadata) -> String {
    format!("{}:{}", meta.dev(), identity_on_its_device(meta))
}

/// `file_identity` less the device: for a file seen through mounts of one
/// file system that are devices of their own (each container's overlay
/// mount of one image).
pub fn identity_on_its_device(meta: &fs::Metadata) -> String {
    format!(
        "{}:{}:{}.{}:{}.{}",
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// Where the digest of the file of metadata `meta` is cached: under its
/// identity, so a file changed in place misses it.
fn cached_digest(meta: &fs::Metadata) -> std::path::PathBuf {
    cache_dir()
        .join("digests")
        .join(bytes_sha256(file_identity(meta).as_bytes()))
}

/// The file's SHA-256, from the cache when the file has not changed.
pub fn file_sha256(path: &Path) -> io::Result<String> {
    let cached = cached_digest(&fs::metadata(path)?);
    if let Ok(digest) = fs::read_to_string(&cached) {
        if digest.len() == 64 {
            return Ok(digest);
        }
    }
    let mut hash = Sha256::new();
    copy_in_large_reads(&mut File::open(path)?, &mut hash)?;
    let digest = provm_trace::hex(&hash.finalize());
    // A cache that cannot be written only costs the next run a re-read.
    let _ = write_atomically(&cached, digest.as_bytes());
    Ok(digest)
}

/// `io::copy` with 1 MiB reads: far fewer system calls than its 8 KiB
/// ones, which count under emulation (the test beds read 1 GiB input
/// disks).
fn copy_in_large_reads(from: &mut impl io::Read, to: &mut impl io::Write) -> io::Result<()> {
    let mut buffer = vec![0; 1 << 20];
    loop {
        match from.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(len) => to.write_all(&buffer[..len])?,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

/// Records `sha256` as the digest of the file at `path`, which the caller
/// has just written and digested in the same pass, so that `file_sha256`
/// need not read it again.
pub fn remember_file_sha256(path: &Path, sha256: &str) {
    if let Ok(meta) = fs::metadata(path) {
        // A cache that cannot be written only costs the next run a re-read.
        let _ = write_atomically(&cached_digest(&meta), sha256.as_bytes());
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, creating
/// the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().expect("cache files live in a directory");
    fs::create_dir_all(dir)?;
    let mut temporary = tempfile::NamedTempFile::new_in(dir)?;
    io::Write::write_all(&mut temporary, bytes)?;
    temporary.persist(path).map_err(|e| e.error)?;
    Ok(())
}
