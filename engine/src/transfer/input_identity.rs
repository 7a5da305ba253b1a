//! Inputs known without reading them: what identifies surveyed inputs'
//! current state (every entry's path, kind, mode or link target, and each
//! file's identity: `digest::file_identity`, inode, size and times, what
//! the cache of image digests trusts), and the digests a run that read
//! inputs of that identity remembered. The input disk's builder looks its
//! disk up by them, so that inputs as a run left them are not read again
//! (1 GiB: 20 s on the SVM test bed).

use std::fs;
use std::path::PathBuf;

use provm_trace::manifest::DataDigest;
use sha2::{Digest, Sha256};

use super::survey::{Planned, Surveyed};
use crate::digest::file_identity;
use crate::kernel::cache_dir;

/// The identity of `trees` as they are now; None if a file cannot be
/// looked at.
pub(super) fn identity(trees: &[Surveyed]) -> Option<String> {
    let mut hasher = Sha256::new();
    hasher.update(b"provm input identity 1\n");
    for tree in trees {
        hasher.update(b"tree\n");
        for entry in &tree.entries {
            let line = match entry {
                Planned::Dir { path, mode } => {
                    [b"d ", &path[..], format!(" {mode}").as_bytes()].concat()
                }
                Planned::Symlink { path, target } => {
                    [b"l ", &path[..], b"\0", &target[..]].concat()
                }
                Planned::File {
                    path, mode, source, ..
                } => {
                    let meta = fs::metadata(source).ok()?;
                    let fields = format!(" {mode} {}", file_identity(&meta));
                    [b"f ", &path[..], fields.as_bytes()].concat()
                }
            };
            hasher.update((line.len() as u64).to_le_bytes());
            hasher.update(&line);
        }
    }
    Some(provm_trace::hex(&hasher.finalize()))
}

/// Where the digests of inputs of this identity are kept.
fn remembered_path(identity: &str) -> PathBuf {
    cache_dir().join("input-identities").join(identity)
}

/// The digests of the inputs of `identity`, as a run that read them
/// remembered them: a line "SHA256 BYTES" per input.
pub(super) fn remembered(identity: &str) -> Option<Vec<DataDigest>> {
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

pub(super) fn remember(identity: &str, digests: &[DataDigest]) {
    let text: String = digests
        .iter()
        .map(|digest| format!("{} {}\n", digest.sha256, digest.bytes))
        .collect();
    // A cache that cannot be written only costs the next run a read.
    let _ = crate::digest::write_atomically(&remembered_path(identity), text.as_bytes());
}
