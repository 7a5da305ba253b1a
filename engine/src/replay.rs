//! `provm replay`: re-executes a trace from its snapshot, feeding the guest
//! the logged inputs and checking every output against the log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use provm_analysis::profile::ProfileError;
use provm_analysis::{Analysis, Instrument, KernelInfo};
use provm_cpu_model::{self as cpu_model, Baseline, CpuRefusal, Platform};
use provm_seams::{
    delivery, state_check, Divergence, ObservedError, RecordedEnd, ReplayEnd, Replayer,
};
use provm_trace::format::FormatError;
use provm_trace::manifest::{ImageIdentity, InterruptDelivery};
use provm_trace::page_digests;
use provm_trace::reader::Trace;
use provm_trace::snapshot::SnapshotError;
use provm_vmm::cpu_probe;
use provm_vmm::disk::image::{BaseImage, ImageError};
use provm_vmm::machine_version::{self, MachineVersionError};
use provm_vmm::vm::{Vm, VmError, VmSnapshot};

use crate::disk::chain::{self, ChainError, ExtractedChain};
use crate::disk::overlay::OverlayLocation;
use crate::embedded;
use crate::explain::{self, Explanation};
use crate::holes::{self, Hole};
use crate::host;
use crate::image::ImageRef;
use crate::machine::{GuestDisk, Machine, MachineError};
use crate::notice;
use crate::observer::{self, GuestKernel, Observer, ObserverError};
use crate::seen_images;
use crate::snapshot;
use crate::transfer::input_disk::{self, InputDisk};
use crate::transfer::DataError;

pub struct ReplayOptions {
    pub trace: PathBuf,
    /// The image; by default the recorded path, or the embedded copy.
    pub image: Option<PathBuf>,
    pub timeout: Duration,
    pub echo_console: bool,
}

impl ReplayOptions {
    /// Replaying `trace` for what analyses find: against the recorded image
    /// (or the trace's copy), with the default timeout, the console quiet.
    pub fn for_analysis(trace: PathBuf) -> Self {
        ReplayOptions {
            trace,
            image: None,
            timeout: Duration::from_secs(crate::start::DEFAULT_TIMEOUT_SECONDS),
            echo_console: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    InputDisk(#[from] DataError),
    #[error("{0}")]
    Trace(#[from] FormatError),
    #[error("the trace was recorded from the image {name} (sha256 {sha256}), which is neither at {} nor known to this host: pass --image PATH (the digests of its files are checked), put it there, or record with --embed-image", .looked.iter().map(|path| path.display().to_string()).collect::<Vec<_>>().join(" nor at "))]
    ImageMissing {
        name: String,
        sha256: String,
        looked: Vec<PathBuf>,
    },
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("refusing to replay: {0}")]
    Cpu(#[from] CpuRefusal),
    #[error("refusing to replay: {0}")]
    MachineVersion(#[from] MachineVersionError),
    #[error("the trace is inconsistent: its snapshot's CPUID is not the one its manifest records")]
    SnapshotCpuid,
    #[error("refusing to replay: the recording delivered interrupts at KVM's interrupt-window exits (an SVM or VMX host; provm before it rang the guest's doorbell everywhere), which a replay finds again with a hardware breakpoint at the logged instruction, and this host's KVM (PVM) stops guest user mode at no breakpoint. Replay it on an SVM or VMX host")]
    NoWindowBreakpoints,
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error("the trace's snapshot cannot be restored: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("cannot analyse this trace: {0}")]
    Profile(#[from] ProfileError),
    /// What observed the replay failed (see `observer`).
    #[error("{0}")]
    Observer(#[source] ObserverError),
    /// An analysis failed: a tool error, not the guest's divergence.
    #[error("an analysis failed at log event {event}: {error}; the replay had matched up to there, and stopped without a verdict")]
    Analysis { event: u64, error: VmError },
}

impl From<ObservedError> for ReplayError {
    fn from(error: ObservedError) -> Self {
        match error {
            ObservedError::Vm(error) => ReplayError::Vm(error),
            ObservedError::Observer { event, error } => ReplayError::Analysis { event, error },
        }
    }
}

/// What a replay found.
pub enum ReplayReport {
    /// To the guest's power-off, with the recorded exit status and disk writes.
    Matched {
        events: u64,
        guest_seconds: f64,
        /// The unlogged inputs the recording host left open, described
        /// (`holes`): what the match could not check.
        unchecked: Vec<String>,
        /// The state checks that matched (0: the trace has none).
        state_checks: u64,
        /// The guest paths whose files the command sent back (`--output`):
        /// re-created by the replay and matched byte for byte.
        outputs: Vec<String>,
    },
    /// The recording was cut short (`why`); the replay matched it up to there.
    CutShort {
        events: u64,
        guest_seconds: f64,
        why: String,
        unchecked: Vec<String>,
        state_checks: u64,
    },
    Diverged {
        report: String,
        /// The divergence for a person: where, which process, and where
        /// memory differs (`explain`).
        explanation: Option<Box<Explanation>>,
    },
}

impl ReplayReport {
    /// The verdict in words, as `provm replay` prints it.
    pub fn summary(&self) -> String {
        match self {
            ReplayReport::Matched {
                events,
                guest_seconds,
                unchecked,
                state_checks,
                outputs,
            } => format!("replay matched: {events} events, {guest_seconds:.3} guest-seconds, the exit status{} and the disk writes, {}{}", output_files(outputs), state_checked(*state_checks), unchecked_inputs(unchecked)),
            ReplayReport::CutShort {
                events,
                guest_seconds,
                why,
                unchecked,
                state_checks,
            } => format!("replay matched up to where the recording was cut short: {events} events, {guest_seconds:.3} guest-seconds, {}\n(the recording ended: {why}){}", state_checked(*state_checks), unchecked_inputs(unchecked)),
            ReplayReport::Diverged {
                report,
                explanation,
            } => match explanation {
                Some(explanation) => format!("{report}\n{}", explanation.text()),
                None => report.clone(),
            },
        }
    }

    /// The verdict for tools: its kind, its words, and for a divergence
    /// its explanation.
    pub fn json(&self) -> serde_json::Value {
        let verdict = match self {
            ReplayReport::Matched { .. } => "matched",
            ReplayReport::CutShort { .. } => "cut-short",
            ReplayReport::Diverged { .. } => "diverged",
        };
        let explanation = match self {
            ReplayReport::Diverged {
                explanation: Some(explanation),
                ..
            } => serde_json::to_value(explanation).expect("serialises"),
            _ => serde_json::Value::Null,
        };
        serde_json::json!({
            "verdict": verdict,
            "summary": self.summary(),
            "explanation": explanation,
        })
    }

    /// Whether what analyses saw in this replay is the run's: the replay
    /// matched, or matched a trace cut short up to its end (said on
    /// stderr); else the divergence report.
    pub fn analysable(&self) -> Result<(), String> {
        match self {
            ReplayReport::Matched { .. } => Ok(()),
            ReplayReport::CutShort { events, why, .. } => {
                notice!("the recording was cut short ({why}); the analysis covers its first {events} events");
                Ok(())
            }
            ReplayReport::Diverged { report, .. } => Err(report.clone()),
        }
    }
}

/// The verdict's words for the output files it re-created, if any.
fn output_files(outputs: &[String]) -> String {
    if outputs.is_empty() {
        return String::new();
    }
    format!(", the files left at {}", outputs.join(" and "))
}

/// The verdict's words for its state checks (see `provm_seams::state_check`).
fn state_checked(checks: u64) -> String {
    match checks {
        0 => "state not checked".into(),
        n => state_check::counted(n),
    }
}

/// The verdict's note of what a match could not check, if anything.
fn unchecked_inputs(unchecked: &[String]) -> String {
    if unchecked.is_empty() {
        return String::new();
    }
    format!(
        "\nnot checked, as the recording host could not log them (see provm inspect):\n  {}",
        unchecked.join("\n  ")
    )
}

/// Replays the trace with one `analysis`, and gives it back with what it
/// found.
pub fn replay_with<A: Analysis>(
    options: &ReplayOptions,
    analysis: A,
) -> Result<(ReplayReport, A), ReplayError> {
    let (report, analyses) = replay(options, vec![Box::new(analysis)])?;
    let analysis = analyses
        .into_iter()
        .next()
        .expect("the replay gives back the analysis it ran");
    Ok((report, downcast(analysis)))
}

/// An analysis `replay` gave back, as the type it was made with.
pub fn downcast<A: Analysis>(analysis: Box<dyn Analysis>) -> A {
    let analysis: Box<dyn std::any::Any> = analysis;
    *analysis
        .downcast::<A>()
        .expect("the analysis is of the type it was made with")
}

/// Replays the trace, running `analyses` on it (none: a plain replay);
/// returns the verdict and the analyses with what they found.
pub fn replay(
    options: &ReplayOptions,
    analyses: Vec<Box<dyn Analysis>>,
) -> Result<(ReplayReport, Vec<Box<dyn Analysis>>), ReplayError> {
    replay_observed(options, &mut [], analyses)
}

/// `replay`, watched by `observers` too.
pub fn replay_observed(
    options: &ReplayOptions,
    observers: &mut [&mut dyn Observer],
    analyses: Vec<Box<dyn Analysis>>,
) -> Result<(ReplayReport, Vec<Box<dyn Analysis>>), ReplayError> {
    let (opened, snapshot) = Opened::open(options)?;
    let replayer = opened.replayer()?;
    let (mut vm, replayer) = opened
        .machine(options.echo_console)
        .restore(snapshot, |_| replayer)?;
    // Read once for all: the kernel embedded in a trace is large.
    let kernel = GuestKernel::new(|| Ok(opened.kernel_info()?));
    observer::each(observers, |observer| observer.attach(&mut vm, &kernel))
        .map_err(ReplayError::Observer)?;
    let deadline = Instant::now() + options.timeout;
    let tsc_at_start = explain::host_tsc();
    let (end, analyses) = if analyses.is_empty() {
        (replayer.replay(&mut vm, deadline)?, analyses)
    } else {
        let kernel = kernel.info().map_err(ReplayError::Observer)?.clone();
        let mut instrument = Instrument::new(kernel, analyses);
        vm.set_guest_debug(&instrument.guest_debug())?;
        replayer.skip_register_check();
        replayer.set_tap(instrument.event_tap());
        let end = replayer.replay_observed(&mut vm, deadline, &mut instrument)?;
        if instrument.stops == 0 {
            notice!("the guest never stopped at the analyses' kernel breakpoints: this host's KVM does not deliver hardware breakpoints, and the analyses saw nothing");
        }
        if instrument.unreadable > 0 {
            notice!(
                "at {} breakpoint stops the guest's structures could not be read; what they held is missing from the analyses",
                instrument.unreadable
            );
        }
        (end, instrument.into_analyses())
    };
    let explanation = match &end {
        ReplayEnd::Diverged { divergence, .. } => {
            opened.explain(&vm, divergence, tsc_at_start..explain::host_tsc())
        }
        _ => None,
    };
    Ok((opened.report(end, explanation), analyses))
}

/// A trace opened for replay: checked against this host, with the image
/// it replays against.
pub struct Opened {
    pub trace: Trace,
    pub base: BaseImage,
    /// Holds an image extracted from the trace for as long as the VM runs.
    _extracted: Option<ExtractedChain>,
    /// The input disk the guest read, when its inputs went by disk.
    pub input_disk: Option<InputDisk>,
    /// The guest's virtual time at the snapshot, where the replay starts.
    pub start_ns: u64,
}

impl Opened {
    /// Opens the trace, checks this host's CPU and the image, and decodes
    /// the snapshot it starts from.
    pub fn open(options: &ReplayOptions) -> Result<(Opened, VmSnapshot), ReplayError> {
        let trace = Trace::open_knowing(&options.trace, embedded::is_cached)?;
        let manifest = &trace.manifest;
        machine_version::supported(manifest.machine_version)?;
        cpu_model::check_here(
            &manifest.cpu,
            &manifest.host.hypervisor,
            &cpu_probe::probe_cpu(Baseline::Host)?,
            Platform::detect(),
        )?;
        if manifest.interrupt_delivery == InterruptDelivery::WindowExit
            && Platform::detect() == Platform::Pvm
        {
            return Err(ReplayError::NoWindowBreakpoints);
        }
        let (base, extracted) = open_image(options, &trace)?;
        chain::check(&base, &manifest.image)?;

        let snapshot = snapshot::decode(
            &trace.snapshot,
            manifest.memory_mib,
            manifest.machine_version,
        )?;
        // The restore sets the snapshot's CPUID and refuses if this host
        // presents anything else; it must be the recorded one.
        if snapshot.state.cpuid() != cpu_model::table(&manifest.cpu) {
            return Err(ReplayError::SnapshotCpuid);
        }
        let input_disk = input_disk::of_trace(&trace)?;
        let opened = Opened {
            start_ns: snapshot.state.clock_ns,
            trace,
            base,
            _extracted: extracted,
            input_disk,
        };
        Ok((opened, snapshot))
    }

    /// The machine the trace's snapshot is restored into.
    pub fn machine(&self, echo_console: bool) -> Machine<'_> {
        Machine {
            base: &self.base,
            memory_mib: self.trace.manifest.memory_mib,
            echo_console,
            disk: GuestDisk::Overlay(OverlayLocation::temporary()),
            exitless_limit: None,
            // A restored VM has the network card and vCPUs its snapshot has.
            net: false,
            cpus: self.trace.manifest.cpus,
            input_disk: self.input_disk.as_ref().map(|disk| disk.path.as_path()),
        }
    }

    /// The replayer of the whole log, from the snapshot; on a fork's trace
    /// it fails the disk access the fork failed.
    pub fn replayer(&self) -> Result<Replayer, ReplayError> {
        let page_digests = match &self.trace.page_digests {
            Some(payload) => page_digests::decode(payload)?,
            None => Vec::new(),
        };
        let replayer = Replayer::new(
            self.trace.events()?,
            self.start_ns,
            RecordedEnd::of(&self.trace.outcome),
        )
        .delivering(delivery::replayed(self.trace.manifest.interrupt_delivery))
        .with_page_digests(page_digests);
        if let Some(access) = self.trace.outcome.disk_error_access {
            replayer.fail_disk_access(access);
        }
        // A window recording's replay stops the guest at hardware
        // breakpoints (`vmm::logged_window`) and checks its registers all
        // the same: such a stop leaves no mark in them (`Vm::window_stopped`
        // clears any DR6 bit one would set). Another KVM reads other state.
        if !host::same_kvm(&self.trace.manifest.host) {
            replayer.skip_register_check();
        }
        Ok(replayer)
    }

    /// The description of the trace's own kernel: its symbols and profile.
    pub fn kernel_info(&self) -> Result<KernelInfo, ReplayError> {
        Ok(KernelInfo::load(
            &self.trace.kernel()?,
            &self.trace.kernel_profile,
        )?)
    }

    /// The report of a replay of this trace that ended so.
    /// The holes the recording host left open, described.
    fn unchecked(&self) -> Vec<String> {
        holes::describe(self.trace.manifest.holes.as_deref().unwrap_or_default())
    }

    /// `divergence` explained from the stopped replay's `vm`; `None` if
    /// the guest or the trace's kernel cannot be read.
    pub fn explain(
        &self,
        vm: &Vm,
        divergence: &Divergence,
        tsc_during_replay: std::ops::Range<u64>,
    ) -> Option<Box<Explanation>> {
        // The vCPU the log had running, which the replay ran too.
        let view = vm.view_of(divergence.vcpu.map_or(0, usize::from)).ok()?;
        let kernel = self.kernel_info().ok()?;
        let vmlinux = self.trace.kernel().ok()?;
        let ids = self.trace.manifest.holes.as_deref().unwrap_or_default();
        let holes: Vec<Hole> = ids.iter().filter_map(|id| Hole::from_id(id)).collect();
        let context = explain::Context {
            view: &view,
            kernel: &kernel,
            profile_json: &self.trace.kernel_profile,
            vmlinux: &vmlinux,
            holes: &holes,
            tsc_during_replay,
        };
        Some(Box::new(explain::explain(divergence, &context)))
    }

    pub fn report(&self, end: ReplayEnd, explanation: Option<Box<Explanation>>) -> ReplayReport {
        let guest_seconds = |guest_ns: u64| guest_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        match end {
            ReplayEnd::Matched {
                events,
                guest_ns,
                state_checks,
            } => ReplayReport::Matched {
                events,
                guest_seconds: guest_seconds(guest_ns),
                unchecked: self.unchecked(),
                state_checks,
                outputs: self.trace.manifest.outputs.clone(),
            },
            ReplayEnd::CutShort {
                events,
                guest_ns,
                state_checks,
            } => ReplayReport::CutShort {
                events,
                guest_seconds: guest_seconds(guest_ns),
                why: self.trace.outcome.ended.clone(),
                unchecked: self.unchecked(),
                state_checks,
            },
            ReplayEnd::Diverged { divergence, rip } => ReplayReport::Diverged {
                report: format!(
                    "replay diverged at {divergence}  guest RIP at the divergence: {rip:#x}\n  the recording ended: {}",
                    self.trace.outcome.ended
                ),
                explanation,
            },
        }
    }
}

/// The image to replay against: the one named, else the recorded one
/// (see `recorded_image`), else where this host last saw an image of its
/// digest (`seen_images`), else the disk made again of the recorded
/// container image, else the copy embedded in the trace (extracted, and
/// returned too so that it outlives the VM).
pub fn open_image(
    options: &ReplayOptions,
    trace: &Trace,
) -> Result<(BaseImage, Option<ExtractedChain>), ReplayError> {
    if let Some(path) = &options.image {
        return Ok((BaseImage::open(path)?, None));
    }
    let image = &trace.manifest.image;
    let sha256 = image
        .chain
        .first()
        .map_or_else(String::new, |file| file.sha256.clone());
    let candidates = recorded_image(&options.trace, &image.path);
    let found = candidates
        .iter()
        .find(|path| path.exists())
        .cloned()
        .or_else(|| seen_images::recall(&sha256));
    if let Some(found) = found.or_else(|| made_again(image)) {
        return Ok((BaseImage::open(&found)?, None));
    }
    if !trace.has_image {
        return Err(ReplayError::ImageMissing {
            name: match &image.container {
                Some(c) => format!(
                    "{} ({} {}) as the disk {}",
                    c.reference, c.digest_of, c.digest, image.path
                ),
                None => image.path.clone(),
            },
            sha256,
            looked: candidates,
        });
    }
    notice!("using the image embedded in the trace");
    let extracted = ExtractedChain::from_trace(trace)?;
    Ok((extracted.open()?, Some(extracted)))
}

/// The disk made again of the container image the trace was recorded
/// from, if that image is still where the trace names it (the chain check
/// then confirms the disk's bytes: the same image makes the same disk).
fn made_again(image: &ImageIdentity) -> Option<PathBuf> {
    let container = image.container.as_ref()?;
    let reference = ImageRef::parse(&container.reference);
    if !reference.path().exists() {
        return None;
    }
    match crate::image::resolve(&reference) {
        Ok(resolved) => Some(resolved.disk),
        Err(error) => {
            notice!("cannot make the disk of {}: {error}", container.reference);
            None
        }
    }
}

/// Where the image the manifest names may be, in order: as recorded (a
/// file name, relative to the current directory, or with
/// `--keep-host-paths` the path as given), then beside the trace, where an
/// archive keeps its files together.
fn recorded_image(trace: &Path, recorded: &str) -> Vec<PathBuf> {
    let recorded = PathBuf::from(recorded);
    let beside_trace = trace
        .parent()
        .unwrap_or(Path::new(""))
        .join(recorded.file_name().unwrap_or(recorded.as_os_str()));
    let mut candidates = vec![recorded];
    if !candidates.contains(&beside_trace) {
        candidates.push(beside_trace);
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_image_is_looked_for_as_named_then_beside_the_trace() {
        assert_eq!(
            recorded_image(Path::new("/deposit/run.provm"), "tiny.qcow2"),
            [
                PathBuf::from("tiny.qcow2"),
                PathBuf::from("/deposit/tiny.qcow2")
            ]
        );
        assert_eq!(
            recorded_image(Path::new("/deposit/run.provm"), "/home/alice/tiny.qcow2"),
            [
                PathBuf::from("/home/alice/tiny.qcow2"),
                PathBuf::from("/deposit/tiny.qcow2")
            ]
        );
        // A trace in the current directory: one place, named once.
        assert_eq!(
            recorded_image(Path::new("run.provm"), "tiny.qcow2"),
            [PathBuf::from("tiny.qcow2")]
        );
    }
}
