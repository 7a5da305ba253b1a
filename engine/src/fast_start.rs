//! Fast start: a snapshot of the booted guest, the image's root mounted
//! read-only and its agent waiting for a command, cached per machine so
//! that a run restores it in about a second instead of booting (tens of
//! seconds where guest ring 0 is emulated).
//!
//! The cache key covers everything the booted state depends on: the kernel,
//! the initramfs, the kernel arguments, the memory size, the CPU model (the
//! whole CPUID table), the image (the kernel has read its partition table
//! and size at boot) and the snapshot's layout: the codec's
//! `SNAPSHOT_VERSION` and the VMM's machine version. Records and
//! replays start from the same bytes, which the trace embeds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use provm_cpu_model::check as cpuid_check;
use provm_cpu_model::CpuProbe;
use provm_trace::format::{FormatError, SectionKind};
use provm_trace::manifest::ImageFile;
use provm_trace::snapshot::{SnapshotError, SNAPSHOT_VERSION};
use provm_vmm::cpu_probe;
use provm_vmm::disk::image::ImageError;
use provm_vmm::disk::{InputMedium, ReadOnly};
use provm_vmm::machine_version;
use provm_vmm::seam::LiveSeam;
use provm_vmm::vm::{VmError, VmSnapshot};

use crate::cached_section;
use crate::digest::{bytes_sha256, file_sha256};
use crate::disk::chain::{self, ChainError};
use crate::disk::overlay::OverlayLocation;
use crate::kernel::cache_dir;
use crate::machine::Prepared;
use crate::notice;
use crate::session::{GuestSession, SessionError};
use crate::snapshot;

#[derive(Debug, thiserror::Error)]
pub enum FastStartError {
    #[error("cannot read {path} to identify it: {source}")]
    Identify {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Image(#[from] ChainError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("booting the guest to snapshot it: {0}")]
    Boot(#[from] SessionError),
    #[error(transparent)]
    Overlay(#[from] ImageError),
    #[error("cannot cache the booted guest's snapshot: {0}")]
    Cache(FormatError),
    #[error("the snapshot cannot be restored: {0}")]
    Decode(SnapshotError),
}

/// The encoded snapshot (see `crate::snapshot`) and its digest.
pub struct BootedSnapshot {
    pub bytes: Vec<u8>,
    pub sha256: String,
}

impl BootedSnapshot {
    pub fn decode(&self, memory_mib: u64) -> Result<VmSnapshot, FastStartError> {
        snapshot::decode(&self.bytes, memory_mib, machine_version::CURRENT)
            .map_err(FastStartError::Decode)
    }
}

/// What a run's machine is, computed once per run: the digests of its
/// inputs and the CPU model its guest gets here.
pub struct Identity {
    pub kernel_sha256: String,
    pub initramfs_sha256: String,
    /// Every file of the image's backing chain.
    pub image: Vec<ImageFile>,
    /// The guest CPU this host gives a VM.
    pub cpu: CpuProbe,
}

impl Identity {
    pub fn of(prepared: &Prepared) -> Result<Identity, FastStartError> {
        let file = |path: &Path| {
            file_sha256(path).map_err(|source| FastStartError::Identify {
                path: path.to_owned(),
                source,
            })
        };
        Ok(Identity {
            kernel_sha256: file(&prepared.boot.kernel)?,
            initramfs_sha256: bytes_sha256(&prepared.boot.initramfs),
            image: chain::identify(&prepared.base)?,
            cpu: cpu_probe::probe_cpu(prepared.boot.cpu)?,
        })
    }
}

/// The booted guest for this machine: from the cache, or booted now and
/// cached.
pub fn booted(
    prepared: &Prepared,
    identity: &Identity,
    deadline: Instant,
) -> Result<BootedSnapshot, FastStartError> {
    let mut key = format!(
        "provm snapshot {SNAPSHOT_VERSION} machine {}\nkernel {}\ninitramfs {}\ncmdline {} {}\nmemory {}\ncpu {:?} {:?}\nimage {:?}",
        machine_version::CURRENT,
        identity.kernel_sha256,
        identity.initramfs_sha256,
        prepared.boot.cmdline,
        identity.cpu.kernel_args.trim(),
        prepared.memory_mib,
        cpuid_check::model_only(&identity.cpu.guest),
        identity.cpu.ignored_by_kernel,
        identity
            .image
            .iter()
            .map(|file| &file.sha256)
            .collect::<Vec<_>>(),
    );
    // More than one vCPU and the input disk are named where the machine has
    // them (the key's form since machine version 4).
    if prepared.cpus > 1 {
        key.push_str(&format!("\ncpus {}", prepared.cpus));
    }
    if prepared.input_disk.is_some() {
        key.push_str("\ninput disk");
    }
    let path = cache_dir()
        .join("snapshots")
        .join(format!("{}.snap", &bytes_sha256(key.as_bytes())[..32]));
    let bytes = match cached_section::read(&path, SectionKind::Snapshot) {
        Some(bytes) => bytes,
        None => boot_and_cache(prepared, &path, deadline)?,
    };
    Ok(BootedSnapshot {
        sha256: bytes_sha256(&bytes),
        bytes,
    })
}

/// Boots the guest, snapshots it once its agent is ready, and caches the
/// snapshot at `path`.
fn boot_and_cache(
    prepared: &Prepared,
    path: &Path,
    deadline: Instant,
) -> Result<Vec<u8>, FastStartError> {
    notice!("booting the guest (first run of this kernel, image and machine; later runs start from its snapshot)");
    let start = Instant::now();
    let mut config = prepared.vm_config(
        Arc::new(LiveSeam::starting_at(0)),
        OverlayLocation::temporary(),
        None,
    )?;
    // Runs restore the snapshot over a fresh overlay: a write made while
    // booting would be missing under the state that depends on it. The
    // agent mounts the root read-only, and only if that writes nothing;
    // should the guest try anyway, it gets an I/O error instead.
    config.disk = Box::new(ReadOnly(config.disk));
    // One booted guest for every input: it boots with the disk empty.
    config.input_disk = config.input_disk.map(|_| InputMedium(None));
    let (mut session, _) = GuestSession::boot(config, &prepared.boot, deadline)?;
    let bytes = snapshot::encode(&session.snapshot()?);
    notice!(
        "booted in {:.1} s; snapshot cached ({} MiB)",
        start.elapsed().as_secs_f64(),
        bytes.len() >> 20
    );
    cached_section::write(path, SectionKind::Snapshot, &bytes).map_err(FastStartError::Cache)?;
    Ok(bytes)
}
