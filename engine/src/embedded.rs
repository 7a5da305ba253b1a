//! The kernel and the initramfs compressed as traces embed them, cached by
//! the digest of the file each holds: a recording takes them from here,
//! and a replay that finds a trace's section here need not decompress it
//! to check it against its manifest's digest.
//!
//! Compressing them at every recording took 0.17 s here (the kernel: 15 MB
//! at level 9) and about 5 s on a slow host (the test bed's emulated L1);
//! checking them at every replay took about 1 s there.

use std::path::PathBuf;

use provm_trace::format::{SectionHeader, SectionKind};

use crate::cached_section;
use crate::kernel;

/// zstd level for the embedded kernel, initramfs and image: archival, so
/// smaller beats faster, within a few seconds for a kernel.
pub const EMBED_LEVEL: i32 = 9;

/// The section of kind `kind` that holds, compressed, the file whose
/// SHA-256 is `sha256`: from the cache, or `read` and compressed now and
/// cached.
pub fn section<E>(
    kind: SectionKind,
    sha256: &str,
    read: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<Vec<u8>, E> {
    let cached = path(sha256);
    if let Some(bytes) = cached_section::read(&cached, kind) {
        return Ok(bytes);
    }
    let bytes =
        zstd::bulk::compress(&read()?, EMBED_LEVEL).expect("compressing to memory cannot fail");
    if let Err(error) = cached_section::write(&cached, kind, &bytes) {
        tracing::warn!("cannot cache the compressed {kind:?} section: {error}");
    }
    Ok(bytes)
}

/// Whether a trace's section `header` is the one cached for the file whose
/// SHA-256 is `sha256`: the same kind, length and checksum, so, once the
/// trace's payload is verified against its checksum, the same bytes, made
/// from that file.
pub fn is_cached(header: &SectionHeader, sha256: &str) -> bool {
    cached_section::header(&path(sha256)).is_some_and(|cached| cached.same_section(header))
}

fn path(sha256: &str) -> PathBuf {
    kernel::cache_dir()
        .join("embedded")
        .join(format!("{sha256}.zstd{EMBED_LEVEL}"))
}
