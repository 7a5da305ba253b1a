//! `provm replay`: re-executes a trace from its snapshot, feeding the guest
//! the logged inputs and checking every output against the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use provm_recorder::format::FormatError;
use provm_recorder::trace::Trace;
use provm_replayer::{ReplayEnd, Replayer};
use provm_vmm::cpuid;
use provm_vmm::disk::image::{BaseImage, ImageError};
use provm_vmm::vm::{self, Vm, VmConfig, VmError};

use crate::digest::file_sha256;
use crate::disk::overlay::{self, OverlayLocation};

pub struct ReplayOptions {
    pub trace: PathBuf,
    /// The base image; by default the recorded path, or the embedded copy.
    pub image: Option<PathBuf>,
    pub timeout: Duration,
    pub echo_console: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{0}")]
    Trace(#[from] FormatError),
    #[error("the image {0} the trace was recorded from is not there: pass --image PATH (its digest is checked), or record with --embed-image")]
    ImageMissing(PathBuf),
    #[error("cannot read the image {path}: {source}")]
    ImageRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("refusing to replay: {path} is not the image the trace was recorded with (sha256 {found}, recorded {recorded})")]
    ImageDiffers {
        path: PathBuf,
        found: String,
        recorded: String,
    },
    #[error("refusing to replay: this host's CPU lacks features the recorded guest saw: {}", .0.join(", "))]
    CpuLacks(Vec<String>),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("the trace's snapshot cannot be restored: {0}")]
    Snapshot(String),
}

/// What a replay found.
pub enum ReplayReport {
    Matched {
        events: u64,
        guest_seconds: f64,
        /// Why the recording stopped, when it was cut short.
        incomplete: Option<String>,
    },
    Diverged {
        report: String,
    },
}

pub fn replay(options: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let trace = Trace::open(&options.trace)?;
    let manifest = &trace.manifest;
    if manifest.provm_version != env!("CARGO_PKG_VERSION") {
        // The container is versioned; the VM state inside it follows provm's.
        eprintln!(
            "provm: this trace was recorded by provm {}; replaying with {}",
            manifest.provm_version,
            env!("CARGO_PKG_VERSION")
        );
    }
    let (features, _) = vm::probe_cpu()?;
    let missing = cpuid::missing_features(&manifest.cpu.features, &features);
    if !missing.is_empty() {
        return Err(ReplayError::CpuLacks(missing));
    }
    // Holds an image extracted from the trace for as long as the VM runs.
    let mut extracted = None;
    let image = image_to_use(options, &trace, &mut extracted)?;
    let found = file_sha256(&image).map_err(|source| ReplayError::ImageRead {
        path: image.clone(),
        source,
    })?;
    if found != manifest.image.sha256 {
        return Err(ReplayError::ImageDiffers {
            path: image,
            found,
            recorded: manifest.image.sha256.clone(),
        });
    }

    let snapshot = provm_recorder::snapshot::decode(&trace.snapshot, manifest.memory_mib << 20)
        .map_err(ReplayError::Snapshot)?;
    let start_ns = snapshot.state.clock_ns;
    let replayer = Arc::new(Replayer::new(trace.events()?, start_ns));
    let base = BaseImage::open(&image)?;
    let config = VmConfig {
        memory_mib: manifest.memory_mib,
        disk: Box::new(overlay::create(&base, OverlayLocation::temporary())?),
        echo_console: options.echo_console,
        seam: replayer.clone(),
        exitless_limit: None,
    };
    let mut vm = Vm::restore(config, snapshot)?;
    let report = match replayer.replay(&mut vm, Instant::now() + options.timeout)? {
        ReplayEnd::Matched { events, guest_ns } => ReplayReport::Matched {
            events,
            guest_seconds: guest_ns.saturating_sub(start_ns) as f64 / 1e9,
            incomplete: (!trace.outcome.complete).then(|| trace.outcome.ended.clone()),
        },
        ReplayEnd::Diverged { divergence, rip } => ReplayReport::Diverged {
            report: format!(
                "replay diverged at {divergence}  guest RIP at the divergence: {rip:#x}\n  the recording ended: {}",
                trace.outcome.ended
            ),
        },
    };
    Ok(report)
}

/// The image to replay against: the one named, else the recorded path,
/// else the copy embedded in the trace (extracted into `extracted`).
fn image_to_use(
    options: &ReplayOptions,
    trace: &Trace,
    extracted: &mut Option<tempfile::NamedTempFile>,
) -> Result<PathBuf, ReplayError> {
    if let Some(path) = &options.image {
        return Ok(path.clone());
    }
    let recorded = Path::new(&trace.manifest.image.path);
    if recorded.exists() || !trace.has_image {
        return recorded
            .exists()
            .then(|| recorded.to_owned())
            .ok_or_else(|| ReplayError::ImageMissing(recorded.to_owned()));
    }
    eprintln!("provm: using the image embedded in the trace");
    let io_error = |source| ReplayError::ImageRead {
        path: trace.path.clone(),
        source,
    };
    let mut file = tempfile::NamedTempFile::new().map_err(io_error)?;
    trace.extract_image(file.as_file_mut())?;
    let path = file.path().to_owned();
    *extracted = Some(file);
    Ok(path)
}
