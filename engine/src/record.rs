//! `provm record`: `provm run` with every input the guest receives logged
//! into a trace that `provm replay` re-executes.
//!
//! The trace starts from the booted guest's snapshot (see `fast_start`) and
//! embeds it with the kernel and initramfs, so that it replays with nothing
//! but the image (or, with `--embed-image`, which embeds the image's whole
//! backing chain, with nothing else at all).

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use provm_cpu_model::{self as cpu_model, Platform};
use provm_guest_agent::{Job, Outcome as CommandOutcome};
use provm_seams::delivery;
use provm_trace::format::{FormatError, SectionKind};
use provm_trace::manifest::{InterruptDelivery, Manifest, Outcome, TerminalSize};
use provm_trace::writer::{Ending, Leading, TraceWriter};
use provm_vmm::machine_version;
use provm_vmm::vm::VmSnapshot;

use crate::digest;
use crate::disk::chain::{self, ChainError};
use crate::embedded::{self, EMBED_LEVEL};
use crate::fast_start::{BootedSnapshot, Identity};
use crate::holes;
use crate::host;
use crate::kernel;
use crate::machine::Prepared;
use crate::observer::{self, Observer};
use crate::requests;
use crate::seen_images;
use crate::session::SessionError;
use crate::start::{self, Booted, Logging, Recording, RunError, RunOptions};
use crate::transfer::{self, JobData};
use crate::utc;

pub struct RecordOptions {
    pub run: RunOptions,
    pub output: PathBuf,
    pub embed_image: bool,
    /// Stop a guest that spins this long without exits while a tick waits.
    pub exitless_limit: Option<Duration>,
    /// Draw the vCPU schedule from this seed (`--chaos`).
    pub chaos: Option<u64>,
    /// Preempt guest code that computes this long without an exit
    /// (`--preempt`; see `provm_vmm::preemption`).
    pub preempt: Option<Duration>,
    /// Preempt computations that end too (`--preempt-computations`).
    pub preempt_computations: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("cannot write the trace {path}: {source}")]
    Trace { path: PathBuf, source: FormatError },
    #[error("cannot read {path} to embed it: {source}")]
    Embed {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kernel has no profile {0} beside it (the offsets of its structures, which replay analyses read): `provm kernel build` makes one; a --kernel needs its own")]
    ProfileMissing(PathBuf),
    #[error("cannot embed the image: {0}")]
    EmbedImage(#[from] ChainError),
    /// The run did not finish; the trace holds it up to that point.
    #[error(
        "{error}\nprovm: the trace {trace} holds the run up to that point and is marked incomplete"
    )]
    CutShort {
        error: Box<RunError>,
        trace: PathBuf,
        /// How the command ended, when only the power-off after it failed:
        /// its output is whole, and `repro --chaos-runs` compares it.
        command: Option<CommandOutcome>,
    },
}

/// A finished recording.
pub struct Recorded {
    pub outcome: CommandOutcome,
    pub trace: PathBuf,
    /// SHA-256 of the trace's event log (see `LogTotals::events_sha256`).
    pub events_sha256: String,
}

/// Records the command, watched by `observers` (whose sections the trace
/// keeps); returns how it ended and where the trace is.
pub fn record(
    options: &RecordOptions,
    observers: &mut [&mut dyn Observer],
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<Recorded, RecordError> {
    let deadline = Instant::now() + options.run.timeout;
    let mut prepared = start::prepare(&options.run)?;
    let (job, mut data) = start::job_with_data(&options.run, &mut prepared)?;
    let Booted {
        identity,
        encoded,
        snapshot,
    } = Booted::of(&prepared, deadline)?;

    let trace_error = |source| RecordError::Trace {
        path: options.output.clone(),
        source,
    };
    let started = Instant::now();
    let leading = leading(
        options, &prepared, &job, &data, &identity, &snapshot, encoded,
    )?;
    if let Some(image) = identity.image.first() {
        seen_images::remember(&options.run.image, &image.sha256);
    }
    let trace = TraceWriter::create(&options.output, &leading)
        .map_err(trace_error)?
        .into_sections();
    tracing::debug!(
        phase = "trace start",
        ms = started.elapsed().as_millis() as u64,
        "the trace's leading sections written"
    );

    install_interrupt_handler();
    let recording_start = Instant::now();
    let guest_start_ns = snapshot.state.clock_ns;
    let recording = Recording {
        trace,
        requests: &requests::REQUESTS,
        exitless_limit: options.exitless_limit,
        chaos: options.chaos,
        preempt: options.preempt,
        preempt_computations: options.preempt_computations,
    };
    let ended = start::start(
        &options.run,
        &prepared,
        snapshot,
        deadline,
        Logging::Trace(recording),
        observers,
    )?
    .run_job(job, &mut data, &prepared, observers, (stdout, stderr));

    let finishing = Instant::now();
    let recorder = ended.recorder.expect("a recording's seam is its recorder");
    let (trace, totals) = recorder.finish().map_err(trace_error)?;
    let trace = trace.expect("a recording's log goes to its trace");
    let mut after = Vec::new();
    observer::each(observers, |observer| {
        after.extend(observer.section()?);
        Ok(())
    })
    .map_err(RunError::Observer)?;
    // Where memory differs, for a replay whose state check finds it does.
    if let Some(pages) = recorder.page_digests() {
        after.push((SectionKind::PageDigests, pages));
    }
    if let Some(disk) = &data.input_disk {
        let embedded = transfer::input_disk::embed(disk).map_err(RunError::from)?;
        after.push((SectionKind::InputDisk, embedded));
    }
    if options.embed_image {
        // The files on this host: the manifest may name them by file name only.
        after.push((
            SectionKind::Image,
            chain::embed(&identity.image, EMBED_LEVEL)?,
        ));
    }
    let result = ended.outcome;
    let ending = Ending {
        complete: result.is_ok(),
        ended: match &result {
            Ok(outcome) => format!("the command ended: {outcome:?}"),
            // The console's tail has a field of its own.
            Err(RunError::Session(SessionError::Guest { error, .. })) => error.to_string(),
            Err(error) => error.to_string(),
        },
        exit_status: result.as_ref().ok().map(|o| o.shell_status()),
    };
    let outcome = Outcome {
        longest_exitless_seconds: Some(recorder.longest_exitless().as_secs_f64()),
        state_check: recorder.final_check(),
        ..Outcome::of_log(
            ending,
            &totals,
            guest_start_ns,
            recording_start.elapsed().as_secs_f64(),
            ended.console_tail,
        )
    };
    let path = TraceWriter::finish(trace, outcome, &after).map_err(trace_error)?;
    tracing::debug!(
        phase = "trace end",
        ms = finishing.elapsed().as_millis() as u64,
        "the trace finished and renamed into place"
    );
    match result {
        Ok(outcome) => {
            transfer::deliver(data.outputs).map_err(RunError::from)?;
            Ok(Recorded {
                outcome,
                trace: path,
                events_sha256: totals.events_sha256,
            })
        }
        Err(error) => Err(RecordError::CutShort {
            error: Box::new(error),
            trace: path,
            command: ended.command,
        }),
    }
}

/// The trace's leading sections: the manifest, and the kernel, its
/// profile, the initramfs and the booted snapshot it starts from.
fn leading(
    options: &RecordOptions,
    prepared: &Prepared,
    job: &Job,
    data: &JobData,
    identity: &Identity,
    snapshot: &VmSnapshot,
    encoded: BootedSnapshot,
) -> Result<Leading, RecordError> {
    let profile_path = kernel::profile_path(&prepared.boot.kernel);
    let kernel_profile =
        std::fs::read(&profile_path).map_err(|_| RecordError::ProfileMissing(profile_path))?;
    let mut manifest = manifest(
        options,
        prepared,
        identity,
        &encoded.sha256,
        snapshot,
        job,
        data,
    );
    manifest.interrupt_delivery = delivery::recorded(delivery::for_recording());
    manifest.kernel_profile_sha256 = digest::bytes_sha256(&kernel_profile);
    Ok(Leading {
        manifest,
        kernel: embedded::section(SectionKind::Kernel, &identity.kernel_sha256, || {
            read_to_embed(&prepared.boot.kernel)
        })?,
        kernel_profile,
        initramfs: embedded::section(SectionKind::Initramfs, &identity.initramfs_sha256, || {
            Ok::<_, RecordError>(prepared.boot.initramfs.clone())
        })?,
        snapshot: encoded.bytes,
    })
}

/// What the trace says about the run before it starts.
fn manifest(
    options: &RecordOptions,
    prepared: &Prepared,
    identity: &Identity,
    snapshot_sha256: &str,
    snapshot: &VmSnapshot,
    job: &Job,
    data: &JobData,
) -> Manifest {
    Manifest {
        provm_version: env!("CARGO_PKG_VERSION").into(),
        provm_commit: option_env!("PROVM_COMMIT").map(Into::into),
        machine_version: machine_version::CURRENT,
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        argv: lossy(&options.run.command),
        env: job
            .env
            .iter()
            .map(|e| String::from_utf8_lossy(e).into_owned())
            .collect(),
        cwd: options.run.cwd.clone(),
        user: options.run.user.clone(),
        root_device: prepared.root_device.clone(),
        image: options.run.host_paths.image_identity(
            &options.run.image,
            &identity.image,
            options.run.container.as_ref(),
        ),
        kernel_sha256: identity.kernel_sha256.clone(),
        // Filled in by `record`, which reads the profile.
        kernel_profile_sha256: String::new(),
        initramfs_sha256: identity.initramfs_sha256.clone(),
        snapshot_sha256: snapshot_sha256.to_owned(),
        kernel_cmdline: prepared.boot.cmdline.clone(),
        memory_mib: prepared.memory_mib,
        cpus: prepared.cpus,
        chaos_seed: options.chaos,
        // The table the snapshot's vCPU holds, which a replay sets: read back
        // from a guest that has booted, some bits are its own (OSXSAVE, the
        // XSAVE area's size), not what a fresh vCPU shows.
        cpu: cpu_model::recorded(
            snapshot.state.cpuid(),
            &identity.cpu.ignored_by_kernel,
            prepared.boot.cpu,
            Platform::detect(),
        ),
        host: host::description(),
        exitless_limit_seconds: options.exitless_limit.map(|d| d.as_secs()),
        // Filled in by `record`, from this host's probe.
        interrupt_delivery: InterruptDelivery::default(),
        holes: Some(
            holes::open_here(
                Platform::detect(),
                &identity.cpu.kernel_args,
                holes::host_has_rdrand(),
            )
            .into_iter()
            .map(|hole| hole.id().to_owned())
            .collect(),
        ),
        fork: None,
        inputs: data.inputs.records(options.run.host_paths),
        input_disk: data.input_disk.as_ref().map(|disk| disk.digest.clone()),
        stdin: data.inputs.stdin_digest(),
        stdin_live: data.live_stdin.is_some(),
        terminal: options.run.terminal.map(|size| TerminalSize {
            rows: size.rows,
            columns: size.columns,
        }),
        outputs: options
            .run
            .outputs
            .iter()
            .map(|o| o.guest.clone())
            .collect(),
    }
}

/// The whole file, in memory. An embedded image is held twice (raw and
/// compressed): a section's header carries its length and digest before
/// its payload, so streaming it into the trace would need a second pass
/// over a temporary file. Reading it back is streamed (`extract_image`).
fn read_to_embed(path: &Path) -> Result<Vec<u8>, RecordError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| RecordError::Embed {
            path: path.to_owned(),
            source,
        })?;
    Ok(bytes)
}

fn lossy(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

extern "C" fn on_interrupt(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    requests::end_recording();
}

fn install_interrupt_handler() {
    // Without the handler, Ctrl-C kills provm and leaves no trace at all.
    if let Err(error) = vmm_sys_util::signal::register_signal_handler(libc::SIGINT, on_interrupt) {
        tracing::warn!("Ctrl-C will not end the recording cleanly: {error}");
    }
}

/// The default trace name: the image's name and the start time, in the
/// current directory.
pub fn default_output(image: &Path) -> PathBuf {
    let stem = image
        .file_stem()
        .map_or("run".into(), |s| s.to_string_lossy().into_owned());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    PathBuf::from(format!("{stem}-{}.provm", utc::timestamp(now)))
}
