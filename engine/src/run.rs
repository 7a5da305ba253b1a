//! `provm run`: start the guest on a copy-on-write view of an image (from
//! the cached snapshot of its booted state when there is one), run one
//! command, and report how it ended.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use provm_cpu_model::{Baseline, Platform};
use provm_guest_agent::{Job, Outcome};
use provm_seams::{Recorder, NEVER_INTERRUPTED};
use provm_vmm::clock::PinnedClock;
use provm_vmm::disk::image::{BaseImage, ImageError};
use provm_vmm::seam::LiveSeam;
use provm_vmm::vm::{BootSource, VmError};

use crate::digest::HashingWriter;
use crate::disk::overlay::OverlayLocation;
use crate::disk::root::{self, RootError};
use crate::fast_start::{self, FastStartError, Identity};
use crate::holes;
use crate::host_paths::HostPaths;
use crate::image::Container;
use crate::initramfs;
use crate::kernel::{self, KernelError};
use crate::machine::{MachineError, Prepared};
use crate::net;
use crate::observer::{self, GuestKernel, JobOutput, Observer, ObserverError};
use crate::pinning::Pinning;
use crate::session::{GuestSession, SessionError};
use crate::transfer::{self, DataError, Input, JobData, Output};

/// The guest kernel's command line (the VM adds its devices).
/// - console=ttyS0: boot messages and panics on the serial port.
/// - nolapic noapic: interrupts come from the VMM's 8259 PIC.
/// - lpj: skips the delay-loop calibration, a busy wait on timer ticks
///   whose result depends on timing.
/// - rodata=off: skips remapping the kernel image page by page (seconds of
///   emulated ring 0 here); the kernel text stays writable.
/// - io_delay=none: no dummy writes to port 0x80 (each one an exit).
/// - 8250.nr_uarts=1: probe only the one serial port there is.
/// - panic=-1: a panicking guest resets at once, ending the run.
/// - rdinit=/init: the guest agent.
/// - quiet: only warnings and errors reach the console (every console byte
///   is a port write), also under `-v`, which shows the console: the
///   booted snapshot is keyed by the command line, and the log level is
///   not the machine (`provm run -v` once booted a snapshot of its own).
pub const KERNEL_ARGS: &str = "console=ttyS0 nolapic noapic lpj=5000 rodata=off io_delay=none 8250.nr_uarts=1 panic=-1 rdinit=/init quiet";

pub const DEFAULT_MEMORY_MIB: u64 = 128;
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 3600;

/// The environment every command starts from; `--env` adds and overrides.
const DEFAULT_ENV: &[&str] = &[
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
];

#[derive(Clone)]
pub struct RunOptions {
    /// The disk the guest boots (for a container image, the disk made of
    /// it: see `crate::image`).
    pub image: PathBuf,
    /// The container image `image` was made of, if it was.
    pub container: Option<Container>,
    pub command: Vec<OsString>,
    pub env: Vec<String>,
    pub cwd: String,
    /// Who the command runs as, `USER[:GROUP]` (a container image's
    /// `User`); `None`: root.
    pub user: Option<String>,
    pub root: Option<String>,
    pub keep_overlay: Option<PathBuf>,
    pub memory_mib: u64,
    pub timeout: Duration,
    pub kernel: Option<PathBuf>,
    pub echo_console: bool,
    /// Logical time and seeded entropy instead of the host's (`--pinned`).
    pub pinned: Option<Pinning>,
    /// The guest's CPU model (`provm record --cpu`).
    pub cpu: Baseline,
    /// How the trace and the provenance name the host's files.
    pub host_paths: HostPaths,
    /// The host's files and folders the command gets (`--input`).
    pub inputs: Vec<Input>,
    /// The command's standard input; `None`: /dev/null.
    pub stdin: Option<Vec<u8>>,
    /// What comes back to the host after the command (`--output`).
    pub outputs: Vec<Output>,
    /// Replace outputs that exist on the host.
    pub force_outputs: bool,
    /// A network card behind provm's NAT (`--net`); none by default.
    pub net: bool,
    /// Where the guest's resolver forwards (`--dns`); by default the
    /// host's resolver.
    pub dns: Option<std::net::SocketAddr>,
    /// The guest's vCPUs (`--cpus`, 1 to `MAX_CPUS`).
    pub cpus: u8,
    /// Whether they run side by side where nothing is recorded (`run`
    /// without `--serial` or `--pinned`); one at a time otherwise.
    pub parallel: bool,
}

impl RunOptions {
    /// Options with provm's defaults: `/` as the working directory, the
    /// built kernel, the default environment.
    pub fn new(image: PathBuf, command: Vec<OsString>) -> Self {
        RunOptions {
            image,
            container: None,
            command,
            env: Vec::new(),
            cwd: "/".into(),
            user: None,
            root: None,
            keep_overlay: None,
            memory_mib: DEFAULT_MEMORY_MIB,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECONDS),
            kernel: None,
            echo_console: false,
            pinned: None,
            cpu: Baseline::Host,
            host_paths: HostPaths::default(),
            inputs: Vec::new(),
            stdin: None,
            outputs: Vec::new(),
            force_outputs: false,
            net: false,
            dns: None,
            cpus: 1,
            parallel: false,
        }
    }

    /// The job's data, checked: nothing has been written yet.
    pub fn job_data(&self) -> Result<JobData, DataError> {
        JobData::prepare(
            &self.inputs,
            self.stdin.clone(),
            &self.outputs,
            self.force_outputs,
            self.memory_mib,
        )
    }
}

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

/// Where the run's overlay goes: kept where the user asked, else a
/// temporary file removed with the VM.
pub fn overlay_location(options: &RunOptions) -> OverlayLocation {
    match &options.keep_overlay {
        Some(path) => OverlayLocation::Keep(path.clone()),
        None => OverlayLocation::temporary(),
    }
}

/// Checks the inputs and assembles the VM: the image's root, the overlay, the
/// kernel and the agent's initramfs.
pub fn prepare(options: &RunOptions) -> Result<Prepared, RunError> {
    if options.net && options.pinned.is_some() {
        return Err(RunError::NetPinned);
    }
    provm_vmm::vm::check_kvm()?;
    let mut base = BaseImage::open(&options.image)?;
    let root = match &options.root {
        Some(value) => root::root_override(&mut base, value),
        None => root::find_root(&mut base),
    }
    .map_err(|source| RunError::Root {
        image: options.image.clone(),
        source,
    })?;
    tracing::debug!(
        device = root.device(),
        reason = root.reason,
        "root file system"
    );
    let kernel = match &options.kernel {
        Some(path) if !path.exists() => return Err(RunError::KernelPath { path: path.clone() }),
        Some(path) => path.clone(),
        None => kernel::find(kernel::Variant::for_cpus(options.cpus))?,
    };
    Ok(Prepared {
        base,
        boot: BootSource {
            kernel,
            initramfs: initramfs::agent_initramfs(),
            cmdline: machine_args(options, &root.device()),
            cpu: options.cpu,
        },
        memory_mib: options.memory_mib,
        root_device: root.device(),
        echo_console: options.echo_console,
        net: options.net,
        cpus: options.cpus,
        // Set from the job's data (`JobData::input_disk`).
        input_disk: None,
    })
}

/// The kernel command line of this run's machine: provm's arguments, the
/// image's root file system, which the agent mounts read-only before the
/// booted snapshot (a job then only makes it writable), and the network
/// card's configuration with `--net`.
fn machine_args(options: &RunOptions, root_device: &str) -> String {
    let base = match options.cpus {
        1 => KERNEL_ARGS.to_owned(),
        // The local APICs without their timers: the PIT's tick reaches
        // the other vCPUs as IPIs (the kernel's tick broadcast), so the
        // VMM has no APIC timer to emulate on the logged clock.
        _ => KERNEL_ARGS.replace("nolapic", "nolapic_timer"),
    };
    let mut args = format!(
        "{base} {} provm.root={root_device}",
        holes::kernel_args(Platform::detect()),
    );
    if options.net {
        args = format!("{args} {}", net::kernel_arg());
    }
    args
}

/// The job the agent runs for these options.
pub fn job(options: &RunOptions, root_device: &str) -> Result<Job, RunError> {
    let mut env: Vec<String> = DEFAULT_ENV.iter().map(|entry| entry.to_string()).collect();
    for entry in &options.env {
        let Some((key, _)) = entry.split_once('=').filter(|(key, _)| !key.is_empty()) else {
            return Err(RunError::BadEnv(entry.clone()));
        };
        env.retain(|existing| !existing.starts_with(&format!("{key}=")));
        env.push(entry.clone());
    }
    Ok(Job {
        argv: options
            .command
            .iter()
            .map(|arg| arg.clone().into_vec())
            .collect(),
        env: env.into_iter().map(String::into_bytes).collect(),
        cwd: options.cwd.clone().into_bytes(),
        user: options.user.clone().unwrap_or_default().into_bytes(),
        root_device: root_device.as_bytes().to_vec(),
        entropy: match &options.pinned {
            Some(pinning) => pinning.entropy(),
            None => fresh_entropy()?,
        },
        // Stamped when the job is sent (GuestSession::run).
        wall_clock_ns: 0,
        // Asked for by an observer that captures it (`Observer::job_starting`).
        provenance: false,
        // Filled in from the job's data (`JobData::describe`).
        ..Job::default()
    })
}

/// 32 bytes from the host's random generator.
fn fresh_entropy() -> Result<Vec<u8>, RunError> {
    let mut seed = vec![0; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(RunError::Entropy)?,
        &mut seed,
    )
    .map_err(RunError::Entropy)?;
    Ok(seed)
}

/// A guest ready for jobs, restored from the booted guest's snapshot
/// (booted and cached first if there is none), watched by `observers`.
pub fn start(
    options: &RunOptions,
    prepared: &Prepared,
    deadline: Instant,
    observers: &mut [&mut dyn Observer],
) -> Result<Started, RunError> {
    let identity = Identity::of(prepared)?;
    let snapshot =
        fast_start::booted(prepared, &identity, deadline)?.decode(prepared.memory_mib)?;
    let machine = prepared.machine(overlay_location(options), None);
    let Some(pinning) = &options.pinned else {
        let (mut vm, _) = machine.restore(snapshot, |start_ns| {
            let seam = LiveSeam::starting_at(start_ns);
            match options.net {
                true => seam.with_network(net::nat(options.dns)),
                false => seam,
            }
        })?;
        if options.parallel {
            vm.run_vcpus_in_parallel();
        }
        attach(observers, &mut vm, prepared)?;
        return Ok(Started {
            session: GuestSession::resume(vm, deadline, &prepared.boot.kernel),
            recorder: None,
        });
    };
    // Delivered as a pinned recording here delivers: the same log.
    let delivery = provm_seams::delivery::for_recording();
    let (mut vm, recorder) = machine.restore(snapshot, |start_ns| {
        Recorder::pinned(None, pinned_clock(pinning, start_ns), &NEVER_INTERRUPTED)
            .delivering(delivery)
    })?;
    attach(observers, &mut vm, prepared)?;
    let mut session = GuestSession::resume(vm, deadline, &prepared.boot.kernel);
    session.pin_wall_clock(pinning.epoch_ns);
    Ok(Started {
        session,
        recorder: Some(recorder),
    })
}

/// Attaches `observers` to the VM of a guest booted from `prepared`.
pub fn attach(
    observers: &mut [&mut dyn Observer],
    vm: &mut provm_vmm::vm::Vm,
    prepared: &Prepared,
) -> Result<(), RunError> {
    let kernel = GuestKernel::new(|| Ok(kernel::info(&prepared.boot.kernel)?));
    observer::each(observers, |observer| observer.attach(vm, &kernel)).map_err(RunError::Observer)
}

/// A started guest, and a pinned run's recorder.
pub struct Started {
    pub session: GuestSession,
    /// A pinned run's recorder (with no trace): it digests the event log.
    pub recorder: Option<Arc<Recorder>>,
}

/// The logical clock of a pinned run whose guest starts at `start_ns`.
pub fn pinned_clock(pinning: &Pinning, start_ns: u64) -> PinnedClock {
    PinnedClock::new(start_ns, pinning.epoch_ns, pinning.exit_step_ns)
}

/// How a run went.
pub struct Ran {
    pub outcome: Outcome,
    /// A pinned run's event log digest (see `LogTotals::events_sha256`).
    pub events_sha256: Option<String>,
}

/// Starts the guest, runs the command with its output streamed to `stdout`
/// and `stderr`, watched by `observers`, powers the guest off and returns
/// how the command ended.
pub fn run(
    options: &RunOptions,
    observers: &mut [&mut dyn Observer],
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<Ran, RunError> {
    let deadline = Instant::now() + options.timeout;
    let mut prepared = prepare(options)?;
    run_prepared(
        options,
        &mut prepared,
        deadline,
        observers,
        (stdout, stderr),
    )
}

/// `run`, on an image checked already.
pub fn run_prepared(
    options: &RunOptions,
    prepared: &mut Prepared,
    deadline: Instant,
    observers: &mut [&mut dyn Observer],
    (stdout, stderr): (&mut dyn Write, &mut dyn Write),
) -> Result<Ran, RunError> {
    let job = job(options, &prepared.root_device)?;
    let mut data = options.job_data()?;
    prepared.input_disk = data.input_disk.as_ref().map(|disk| disk.path.clone());
    let Started {
        mut session,
        recorder,
    } = start(options, prepared, deadline, observers)?;
    let outcome = run_job(
        &mut session,
        job,
        &mut data,
        prepared,
        observers,
        (stdout, stderr),
    )?;
    session.power_off()?;
    drop(session);
    transfer::deliver(data.outputs)?;
    // Without a trace the log writes nothing, so it cannot fail.
    let events_sha256 = recorder.map(|recorder| {
        let (_, totals) = recorder.finish().expect("a digest-only log has no writes");
        totals.events_sha256
    });
    Ok(Ran {
        outcome,
        events_sha256,
    })
}

/// Runs `job` with `data` in `session`, on the machine `prepared`, watched
/// by `observers`.
pub fn run_job(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn options(env: &[&str]) -> RunOptions {
        RunOptions {
            env: env.iter().map(|e| e.to_string()).collect(),
            cwd: "/tmp".into(),
            ..RunOptions::new("img".into(), vec!["sh".into(), "-c".into(), "true".into()])
        }
    }

    #[test]
    fn env_overrides_defaults_and_adds() {
        let job = job(&options(&["PATH=/bin", "FOO=a=b"]), "/dev/vda1").unwrap();
        let env: Vec<String> = job
            .env
            .into_iter()
            .map(|e| String::from_utf8(e).unwrap())
            .collect();
        assert!(env.contains(&"PATH=/bin".to_owned()));
        assert!(env.contains(&"FOO=a=b".to_owned()));
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
        assert!(env.contains(&"HOME=/root".to_owned()));
        assert_eq!(job.root_device, b"/dev/vda1");
        assert_eq!(job.cwd, b"/tmp");
    }

    #[test]
    fn malformed_env_is_refused() {
        assert!(matches!(
            job(&options(&["NOEQUALS"]), "/dev/vda"),
            Err(RunError::BadEnv(_))
        ));
        assert!(matches!(
            job(&options(&["=x"]), "/dev/vda"),
            Err(RunError::BadEnv(_))
        ));
    }
}
