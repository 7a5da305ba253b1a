//! The machine a guest is restored into, the same for a run, a recording
//! and a replay: a disk overlaying the base image, the RAM, the console,
//! and the seam that drives it from the snapshot's virtual time on.

use std::sync::Arc;
use std::time::Duration;

use std::path::{Path, PathBuf};

use provm_vmm::disk::image::{BaseImage, ImageError};
use provm_vmm::disk::InputMedium;
use provm_vmm::seam::Seam;
use provm_vmm::vm::{BootSource, Vm, VmConfig, VmError, VmSnapshot};

use crate::disk::overlay::{self, OverlayLocation};

pub struct Machine<'a> {
    pub base: &'a BaseImage,
    pub memory_mib: u64,
    pub echo_console: bool,
    /// Where the overlay that takes the guest's writes goes.
    pub overlay: OverlayLocation,
    /// See `VmConfig::exitless_limit`.
    pub exitless_limit: Option<Duration>,
    /// See `VmConfig::net`.
    pub net: bool,
    /// See `VmConfig::cpus`.
    pub cpus: u8,
    /// The input disk's image (see `VmConfig::input_disk`).
    pub input_disk: Option<&'a Path>,
}

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Vm(#[from] VmError),
}

impl Machine<'_> {
    /// The VM's configuration, with a fresh overlay and `seam`.
    pub fn config(self, seam: Arc<dyn Seam>) -> Result<VmConfig, ImageError> {
        Ok(VmConfig {
            memory_mib: self.memory_mib,
            disk: Box::new(overlay::create(self.base, self.overlay)?),
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
        let config = self.config(seam.clone())?;
        Ok((Vm::restore(config, snapshot)?, seam))
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
            overlay,
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
