//! The machine a guest is restored into, the same for a run, a recording,
//! a replay, a fork and a debugger session: a disk over the base image,
//! the RAM, the console, and the seam that drives it from the snapshot's
//! virtual time on.

use std::sync::Arc;
use std::time::Duration;

use std::path::{Path, PathBuf};

use provm_vmm::disk::image::{BaseImage, ImageError};
use provm_vmm::disk::{Disk, InputMedium};
use provm_vmm::seam::Seam;
use provm_vmm::vm::{BootSource, Vm, VmConfig, VmError, VmSnapshot};

use crate::disk::overlay::{self, OverlayLocation};

pub struct Machine<'a> {
    pub base: &'a BaseImage,
    pub memory_mib: u64,
    pub echo_console: bool,
    /// What takes the guest's writes.
    pub disk: GuestDisk,
    /// See `VmConfig::exitless_limit`.
    pub exitless_limit: Option<Duration>,
    /// See `VmConfig::net`.
    pub net: bool,
    /// See `VmConfig::cpus`.
    pub cpus: u8,
    /// The input disk's image (see `VmConfig::input_disk`).
    pub input_disk: Option<&'a Path>,
}

/// The guest's disk, /dev/vda: what takes its writes over the base image.
pub enum GuestDisk {
    /// A fresh overlay, there.
    Overlay(OverlayLocation),
    /// The caller's own disk over the image: the debugger's, which keeps a
    /// journal of the writes so that it can rewind them.
    Given(Box<dyn Disk>),
}

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Vm(#[from] VmError),
}

impl Machine<'_> {
    /// The VM's configuration, with its disk and `seam`.
    pub fn config(self, seam: Arc<dyn Seam>) -> Result<VmConfig, ImageError> {
        Ok(VmConfig {
            memory_mib: self.memory_mib,
            disk: match self.disk {
                GuestDisk::Overlay(location) => Box::new(overlay::create(self.base, location)?),
                GuestDisk::Given(disk) => disk,
            },
            echo_console: self.echo_console,
            seam,
            exitless_limit: self.exitless_limit,
            net: self.net,
            cpus: self.cpus,
            input_disk: input_medium(self.input_disk)?,
        })
    }

    /// A VM restored from `snapshot`, driven by the seam that `seam_at`
    /// makes for the snapshot's virtual time (its clock must go on from
    /// there); returns the seam too.
    pub fn restore<S: Seam + 'static>(
        self,
        snapshot: VmSnapshot,
        seam_at: impl FnOnce(u64) -> S,
    ) -> Result<(Vm, Arc<S>), MachineError> {
        let seam = Arc::new(seam_at(snapshot.state.clock_ns));
        Ok((self.restore_with(snapshot, seam.clone())?, seam))
    }

    /// A VM restored from `snapshot`, driven by `seam`, which the caller
    /// made for the snapshot's virtual time and keeps across restores (the
    /// debugger's replayer, rewound with each).
    pub fn restore_with(
        self,
        snapshot: VmSnapshot,
        seam: Arc<dyn Seam>,
    ) -> Result<Vm, MachineError> {
        Ok(Vm::restore(self.config(seam)?, snapshot)?)
    }
}

/// The input disk's medium: the image at `path`, if any.
pub fn input_medium(path: Option<&Path>) -> Result<Option<InputMedium>, ImageError> {
    match path {
        Some(path) => Ok(Some(InputMedium(Some(Box::new(BaseImage::open(path)?))))),
        None => Ok(None),
    }
}

/// A checked image and the guest to run on it.
pub struct Prepared {
    pub base: BaseImage,
    pub boot: BootSource,
    pub memory_mib: u64,
    pub root_device: String,
    pub(crate) echo_console: bool,
    /// Whether the guest has a network card (`--net`).
    pub net: bool,
    /// The guest's vCPUs (`--cpus`).
    pub cpus: u8,
    /// The image of the input disk, when the job's inputs go by disk
    /// (`transfer::JobData::input_disk`).
    pub input_disk: Option<PathBuf>,
}

impl Prepared {
    /// The machine to run the guest in, its overlay at `overlay`.
    pub fn machine(
        &self,
        overlay: OverlayLocation,
        exitless_limit: Option<Duration>,
    ) -> Machine<'_> {
        Machine {
            base: &self.base,
            memory_mib: self.memory_mib,
            echo_console: self.echo_console,
            disk: GuestDisk::Overlay(overlay),
            exitless_limit,
            net: self.net,
            cpus: self.cpus,
            input_disk: self.input_disk.as_deref(),
        }
    }

    /// A machine on a fresh overlay of the image, at `location`.
    pub fn vm_config(
        &self,
        seam: Arc<dyn Seam>,
        location: OverlayLocation,
        exitless_limit: Option<Duration>,
    ) -> Result<VmConfig, ImageError> {
        self.machine(location, exitless_limit).config(seam)
    }
}
