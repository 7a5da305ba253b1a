//! The one start path of a guest that runs a job, whatever its seam:
//! `provm run` (live, or pinned), `provm record` (every input logged into
//! a trace) and, through them, a container's `start` in provm-runtime.
//!
//! In order: the machine checked and assembled from the options
//! (`prepare`), the job and its data (`job_with_data`), the booted guest's
//! snapshot, from the cache or booted now (`Booted::of`), the guest
//! restored from it into its `Machine` with the seam `Logging` chooses,
//! the observers attached, the session resumed with the clock pinned or
//! not (`start`), the job run and the guest powered off
//! (`Started::run_job`). What a driver adds goes between these steps:
//! a recording writes its trace's leading sections once the snapshot is
//! known and finishes the trace once the guest is off (`record.rs`).
//!
//! A replay starts from its trace instead (`replay::Opened`), into
//! the same `Machine`, with the replayer as its seam; it runs no job of
//! its own: the log holds what the host sent.

mod job;
mod options;
mod prepare;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provm_guest_agent::{Job, Outcome};
use provm_seams::{delivery, HostRequests, Recorder};
use provm_trace::format::SectionWriter;
use provm_vmm::clock::PinnedClock;
use provm_vmm::disk::image::ImageError;
use provm_vmm::seam::LiveSeam;
use provm_vmm::vm::{Vm, VmError, VmSnapshot};

use crate::digest::HashingWriter;
use crate::disk::root::RootError;
use crate::fast_start::{self, BootedSnapshot, FastStartError, Identity};
use crate::kernel::KernelError;
use crate::kernel_info;
use crate::machine::{Machine, MachineError, Prepared};
use crate::net;
use crate::observer::{self, GuestKernel, JobOutput, Observer, ObserverError};
use crate::pinning::Pinning;
use crate::requests;
use crate::session::{GuestSession, SessionError};
use crate::transfer::{DataError, JobData};

pub use job::job;
pub use options::{RunOptions, DEFAULT_MEMORY_MIB, DEFAULT_TIMEOUT_SECONDS};
pub use prepare::prepare;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("{image}: {source}")]
    Root { image: PathBuf, source: RootError },
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("cannot boot the kernel {path}: it does not exist")]
    KernelPath { path: PathBuf },
    #[error("--env {0:?} is not of the form KEY=VALUE")]
    BadEnv(String),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    FastStart(#[from] FastStartError),
    #[error("--net and --pinned do not go together: a pinned run takes no input from outside, and the network is outside; record the run with --net instead, and replay it")]
    NetPinned,
    #[error("cannot read fresh entropy for the guest: {0}")]
    Entropy(std::io::Error),
    /// What observed the run failed (see `observer`).
    #[error("{0}")]
    Observer(#[source] ObserverError),
}

/// What the guest's seam logs of what crosses it.
pub enum Logging {
    /// Nothing (`provm run`): the seam is live, the host's clock, entropy
    /// and network; on a pinned run, a recorder on the pinned clock that
    /// keeps only its log's digest (`Ended::recorder`).
    Off,
    /// Everything, into a trace (`provm record`).
    Trace(Recording),
}

/// What a recording's seam needs beyond a run's.
pub struct Recording {
    /// The trace's sections, after its leading ones: the event log goes on
    /// from there.
    pub trace: SectionWriter,
    /// What signal handlers ask of it: to end at the guest's next exit
    /// (Ctrl-C), or to signal the command there.
    pub requests: &'static HostRequests,
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

/// The job `options` ask for and its data, checked; the machine gets the
/// input disk when the data goes by disk.
pub fn job_with_data(
    options: &RunOptions,
    prepared: &mut Prepared,
) -> Result<(Job, JobData), RunError> {
    let job = job(options, &prepared.root_device)?;
    let data = options.job_data()?;
    prepared.input_disk = data.input_disk.as_ref().map(|disk| disk.path.clone());
    Ok((job, data))
}

/// The booted guest a run starts from (see `fast_start`).
pub struct Booted {
    /// What the machine is: the digests of its inputs, its CPU model.
    pub identity: Identity,
    /// The snapshot as the cache holds it and a trace embeds it.
    pub encoded: BootedSnapshot,
    pub snapshot: VmSnapshot,
}

impl Booted {
    /// The booted guest of the machine `prepared`: from the cache, or booted
    /// now (by `deadline`) and cached.
    pub fn of(prepared: &Prepared, deadline: Instant) -> Result<Booted, RunError> {
        let started = Instant::now();
        let identity = Identity::of(prepared)?;
        let encoded = fast_start::booted(prepared, &identity, deadline)?;
        let snapshot = encoded.decode(prepared.memory_mib)?;
        tracing::debug!(
            phase = "booted guest",
            ms = started.elapsed().as_millis() as u64,
            "the booted guest's snapshot, from the cache or booted now"
        );
        Ok(Booted {
            identity,
            encoded,
            snapshot,
        })
    }
}

/// A guest ready for its job: restored from `snapshot` into the machine
/// `prepared` with the seam `logging` chooses, watched by `observers`.
pub fn start(
    options: &RunOptions,
    prepared: &Prepared,
    snapshot: VmSnapshot,
    deadline: Instant,
    logging: Logging,
    observers: &mut [&mut dyn Observer],
) -> Result<Started, RunError> {
    let (exitless_limit, chaos, requests) = match &logging {
        Logging::Off => (None, None, &requests::REQUESTS),
        Logging::Trace(recording) => (
            recording.exitless_limit,
            recording.chaos,
            recording.requests,
        ),
    };
    let started = Instant::now();
    let machine = prepared.machine(options.overlay_location(), exitless_limit);
    let (mut vm, recorder) = restore(machine, snapshot, options, logging)?;
    if let Some(seed) = chaos {
        vm.chaos(seed);
    }
    let kernel = GuestKernel::new(|| Ok(kernel_info::load(&prepared.boot.kernel)?));
    observer::each(observers, |observer| observer.attach(&mut vm, &kernel))
        .map_err(RunError::Observer)?;
    let mut session = GuestSession::resume(vm, deadline, &prepared.boot.kernel);
    session.signal_command_as(requests);
    if let Some(pinning) = &options.pinned {
        session.pin_wall_clock(pinning.epoch_ns);
    }
    tracing::debug!(
        phase = "restore",
        ms = started.elapsed().as_millis() as u64,
        "the guest restored from its snapshot"
    );
    Ok(Started { session, recorder })
}

/// The VM restored into `machine` with its seam, one of four: live, or a
/// recorder logging into a trace, or only digesting its log, on the
/// host's clock or the pinned one. Returns the recorder, if it is one.
fn restore(
    machine: Machine<'_>,
    snapshot: VmSnapshot,
    options: &RunOptions,
    logging: Logging,
) -> Result<(Vm, Option<Arc<Recorder>>), RunError> {
    let network = || net::nat(options.dns);
    let pinned_clock = |pinning: &Pinning, start_ns| {
        PinnedClock::new(start_ns, pinning.epoch_ns, pinning.exit_step_ns)
    };
    match (logging, &options.pinned) {
        (Logging::Off, None) => {
            let (mut vm, _) = machine.restore(snapshot, |start_ns| {
                let seam = LiveSeam::starting_at(start_ns)
                    .with_host_input(Box::new(|| requests::REQUESTS.input_due()));
                match options.net {
                    true => seam.with_network(network()),
                    false => seam,
                }
            })?;
            if options.parallel {
                vm.run_vcpus_in_parallel();
            }
            Ok((vm, None))
        }
        (Logging::Off, Some(pinning)) => recorded(machine, snapshot, |start_ns| {
            Recorder::pinned(None, pinned_clock(pinning, start_ns), &requests::REQUESTS)
        }),
        (Logging::Trace(recording), Some(pinning)) => recorded(machine, snapshot, |start_ns| {
            Recorder::pinned(
                Some(recording.trace),
                pinned_clock(pinning, start_ns),
                recording.requests,
            )
            .preempting(recording.preempt, recording.preempt_computations)
        }),
        (Logging::Trace(recording), None) => recorded(machine, snapshot, |start_ns| {
            let recorder = Recorder::new(recording.trace, start_ns, recording.requests)
                .preempting(recording.preempt, recording.preempt_computations);
            match options.net {
                true => recorder.with_network(network()),
                false => recorder,
            }
        }),
    }
}

/// The VM restored into `machine`, driven by the recorder `recorder_at`
/// makes, delivering interrupts as recordings do.
fn recorded(
    machine: Machine<'_>,
    snapshot: VmSnapshot,
    recorder_at: impl FnOnce(u64) -> Recorder,
) -> Result<(Vm, Option<Arc<Recorder>>), RunError> {
    // A pinned run delivers as a recording does: the same log.
    let delivery = delivery::for_recording();
    let (vm, recorder) = machine.restore(snapshot, |start_ns| {
        recorder_at(start_ns).delivering(delivery)
    })?;
    Ok((vm, Some(recorder)))
}

/// A started guest, and its recorder when its seam is one.
pub struct Started {
    pub session: GuestSession,
    pub recorder: Option<Arc<Recorder>>,
}

/// A guest whose job ran, powered off.
pub struct Ended {
    /// How the command ended, once the guest powered off; or why it did not.
    pub outcome: Result<Outcome, RunError>,
    /// How the command ended, also when only the power-off after it failed.
    pub command: Option<Outcome>,
    /// The console's last lines.
    pub console_tail: String,
    /// The recorder, when the seam was one.
    pub recorder: Option<Arc<Recorder>>,
}

impl Started {
    /// Runs `job` with `data` on the machine `prepared`, watched by
    /// `observers`, the command's output streamed to `stdout` and
    /// `stderr`, then powers the guest off.
    pub fn run_job(
        mut self,
        job: Job,
        data: &mut JobData,
        prepared: &Prepared,
        observers: &mut [&mut dyn Observer],
        streams: (&mut dyn Write, &mut dyn Write),
    ) -> Ended {
        let started = Instant::now();
        let command = run_job(&mut self.session, job, data, prepared, observers, streams);
        let ran = started.elapsed();
        tracing::debug!(
            phase = "command",
            ms = ran.as_millis() as u64,
            "the job ran"
        );
        let command_ended = command.as_ref().ok().copied();
        let outcome = command.and_then(|outcome| {
            self.session.power_off()?;
            Ok(outcome)
        });
        tracing::debug!(
            phase = "power off",
            ms = (started.elapsed() - ran).as_millis() as u64,
            "the guest synced its disk and powered off"
        );
        Ended {
            outcome,
            command: command_ended,
            console_tail: self.session.console_tail(),
            recorder: self.recorder,
        }
    }
}

/// Runs `job` with `data` in `session`, on the machine `prepared`, watched
/// by `observers`.
fn run_job(
    session: &mut GuestSession,
    mut job: Job,
    data: &mut JobData,
    prepared: &Prepared,
    observers: &mut [&mut dyn Observer],
    (stdout, stderr): (&mut dyn Write, &mut dyn Write),
) -> Result<Outcome, RunError> {
    observer::each(observers, |observer| {
        observer.job_starting(&mut job, prepared)
    })
    .map_err(RunError::Observer)?;
    let (mut out, mut err) = (HashingWriter::new(stdout), HashingWriter::new(stderr));
    let outcome = session.run_with_data(job, data, &mut out, &mut err)?;
    let output = JobOutput {
        stdout: out.digested(),
        stderr: err.digested(),
    };
    observer::each(observers, |observer| observer.job_ended(session, &output))
        .map_err(RunError::Observer)?;
    Ok(outcome)
}
