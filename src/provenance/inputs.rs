//! The files the VM boots and reads, as the provenance graph names them:
//! by role and digest (`image`, `backing-file-1`, `kernel`, `initramfs`),
//! with the file's name for people (its path only when the recording kept
//! host paths, see `host_paths`).

use provm_trace::manifest::{ImageFile, Manifest};

use super::capture::Boundary;
use super::ProvenanceError;
use provm_engine::digest::{bytes_sha256, file_sha256};
use provm_engine::disk::chain;
use provm_engine::host_paths::HostPaths;
use provm_engine::machine::Prepared;

const INITRAMFS: &str = "the guest agent's initramfs, built into provm";

/// The inputs of the machine `prepared` assembled, read on this host.
pub fn of_machine(
    prepared: &Prepared,
    host_paths: HostPaths,
) -> Result<Vec<Boundary>, ProvenanceError> {
    let chain =
        chain::identify(&prepared.base).map_err(|e| ProvenanceError::Input(e.to_string()))?;
    let kernel = &prepared.boot.kernel;
    let io_error = |source| ProvenanceError::Io {
        path: kernel.clone(),
        source,
    };
    let mut inputs = image(&host_paths.chain(&chain));
    inputs.push(Boundary {
        name: "kernel".into(),
        sha256: file_sha256(kernel).map_err(io_error)?,
        size: std::fs::metadata(kernel).map_err(io_error)?.len(),
        content: vec![host_paths.name(kernel)],
    });
    inputs.push(Boundary {
        name: "initramfs".into(),
        sha256: bytes_sha256(&prepared.boot.initramfs),
        size: prepared.boot.initramfs.len() as u64,
        content: vec![INITRAMFS.into()],
    });
    Ok(inputs)
}

/// The same inputs, as the trace's manifest records them.
pub fn of_trace(manifest: &Manifest) -> Vec<Boundary> {
    let mut inputs = image(&manifest.image.chain);
    inputs.extend([
        Boundary {
            name: "kernel".into(),
            sha256: manifest.kernel_sha256.clone(),
            size: 0,
            content: vec!["the guest kernel the trace embeds".into()],
        },
        Boundary {
            name: "initramfs".into(),
            sha256: manifest.initramfs_sha256.clone(),
            size: 0,
            content: vec![INITRAMFS.into()],
        },
    ]);
    inputs
}

/// One input per file of the image's chain.
fn image(files: &[ImageFile]) -> Vec<Boundary> {
    files
        .iter()
        .map(|file| Boundary {
            name: chain::role_name(file),
            sha256: file.sha256.clone(),
            size: file.size,
            content: vec![file.path.clone()],
        })
        .collect()
}
