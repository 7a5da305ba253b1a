//! What observers know of a built guest kernel: its symbols, read once
//! per kernel and cached by its digest, and its profile's structure
//! offsets.

use std::path::{Path, PathBuf};

use provm_analysis::profile::{Offsets, ProfileError, Symbols};
use provm_analysis::KernelInfo;

use crate::digest::{file_sha256, write_atomically};
use crate::kernel::{cache_dir, profile_path};

/// Why a built kernel's description could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KernelInfoError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

/// The description of the kernel at `vmlinux` (its symbols) and of the
/// profile built beside it (its structure offsets).
pub fn load(vmlinux: &Path) -> Result<KernelInfo, KernelInfoError> {
    let profile = profile_path(vmlinux);
    let profile_json = std::fs::read(&profile).map_err(|source| KernelInfoError::Read {
        path: profile,
        source,
    })?;
    Ok(KernelInfo {
        symbols: symbols(vmlinux)?,
        offsets: Offsets::from_json(&profile_json)?,
    })
}

/// The few symbols an observer uses, cached by the vmlinux's digest: every
/// run and recording loads them, and reading the whole 15 MB file for
/// them was most of a recording's restore on a slow host (1.2 s of the
/// test bed's emulated L1, the file on 9p).
fn symbols(vmlinux: &Path) -> Result<Symbols, KernelInfoError> {
    let read_error = |source| KernelInfoError::Read {
        path: vmlinux.to_owned(),
        source,
    };
    let cached = cache_dir().join("symbols").join(format!(
        "{}.json",
        file_sha256(vmlinux).map_err(read_error)?
    ));
    let from_cache = std::fs::read(&cached)
        .ok()
        .and_then(|json| serde_json::from_slice(&json).ok());
    if let Some(symbols) = from_cache {
        return Ok(symbols);
    }
    let symbols = Symbols::from_vmlinux(&std::fs::read(vmlinux).map_err(read_error)?)?;
    let json = serde_json::to_vec(&symbols).expect("symbols serialise");
    // A cache that cannot be written only costs the next run a re-read.
    let _ = write_atomically(&cached, &json);
    Ok(symbols)
}
