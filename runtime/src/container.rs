//! The container's process (`init`, started by `create`): it waits for
//! `start`, runs the command in provm's VM, recorded unless the bundle
//! says not, with its own standard streams as the command's, writes what
//! the command wrote to its root back to the bundle's root directory, and
//! exits with the command's status (128 + N when signal N stopped it).

use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use provm_engine::disk::file_system;
use provm_engine::image::{Container as ImageOrigin, ContainerConfig, DigestKind, ImageRef};
use provm_engine::record::{self, RecordOptions};
use provm_engine::run;
use provm_engine::start::RunOptions;
use provm_engine::timing::TimingObserver;
use provm_engine::transfer::{live_stdin, terminal, Input, Output};

use crate::bundle;
use crate::fifo;
use crate::rootfs;
use crate::signals;
use crate::state::{Container, Containers, FIFO};

/// The status of a container whose command could not be run (runc's
/// `create` fails instead; here the VM starts after `start`).
pub const FAILED: i32 = 125;
/// How long a container may run: the engine needs a limit, and a
/// container has none of its own.
const TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
/// As `provm record`'s default: a guest spinning this long with no exit
/// while a tick waits is stopped.
const EXITLESS_LIMIT: Duration = Duration::from_secs(60);
/// The run's overlay, in the container's state folder: kept for the
/// write-back, then removed.
const ROOT_OVERLAY: &str = "root-overlay.qcow2";

/// Runs the container `id`; returns its exit status.
pub fn run(containers: &Containers, id: &str) -> Result<i32, String> {
    let container = containers.container(id)?;
    fifo::wait_for_start(&containers.dir(id).join(FIFO))
        .map_err(|error| format!("waiting for start: {error}"))?;
    let overlay = containers.dir(id).join(ROOT_OVERLAY);
    let mut options = run_options(&container);
    (options.stdin, options.live_stdin) = stdin(&container)?;
    if container.plan.terminal {
        let size = provm_guest_agent::pty::size(std::io::stdin().as_fd())
            .map_err(|error| format!("cannot read the terminal's size: {error}"))?;
        terminal::forward_resizes()
            .map_err(|error| format!("cannot follow the terminal's size: {error}"))?;
        options.terminal = Some(size);
    }
    options.keep_overlay = Some(overlay.clone());
    // The write-back reads it with ext4-view, which replays the journal.
    options.overlay_reader_replays_journal = true;
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    signals::forward_into_the_guest()?;
    let status = match &container.trace {
        None => run::run(&options, &mut [], &mut stdout, &mut stderr)
            .map(|ran| ran.outcome.shell_status())
            .map_err(|error| error.to_string()),
        Some(trace) => recorded(options, trace.clone(), &mut stdout, &mut stderr),
    };
    stdout.flush().ok();
    // A run that never started its VM made no overlay.
    if overlay.exists() {
        let started = Instant::now();
        // The command's status stands: its run is over, whatever this gives.
        if let Err(error) = write_back_root(&container, &overlay) {
            eprintln!("provm-runtime: {error}");
        }
        tracing::debug!(
            phase = "write back",
            ms = started.elapsed().as_millis() as u64,
            "the root's changes written back to the bundle"
        );
        std::fs::remove_file(&overlay).ok();
    }
    status
}

/// What the command wrote to its root, from the run's kept `overlay`,
/// written back to the bundle's root directory (see `rootfs`).
fn write_back_root(container: &Container, overlay: &Path) -> Result<(), String> {
    let open = |path: &Path| {
        file_system::open_root(path).map_err(|error| {
            format!(
                "cannot read the container's root from {}: {error}",
                path.display()
            )
        })
    };
    // What is written back to the host's folders is not the root's.
    let inputs: Vec<String> = container
        .plan
        .host_folders()
        .map(|(_, guest)| guest.clone())
        .collect();
    let changes = rootfs::write_back(
        &open(&container.disk)?,
        &open(overlay)?,
        &container.plan.rootfs,
        &inputs,
    )?;
    if !changes.skipped.is_empty() {
        eprintln!(
            "provm-runtime: not written back to the root directory (devices, FIFOs and sockets): {}",
            changes.skipped.join(", ")
        );
    }
    Ok(())
}

fn recorded(
    options: RunOptions,
    trace: PathBuf,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<i32, String> {
    let options = RecordOptions {
        run: options,
        output: trace,
        embed_image: false,
        exitless_limit: Some(EXITLESS_LIMIT),
        chaos: None,
        preempt: None,
        preempt_computations: false,
    };
    // The exit timing, as `provm record` keeps it: `provm blame` and the
    // query's blame tables read a container's trace as any other.
    let mut timing = TimingObserver::new("record", true, None);
    record::record(&options, &mut [&mut timing], stdout, stderr)
        .map(|recorded| recorded.outcome.shell_status())
        .map_err(|error| error.to_string())
}

/// The command's standard input, the process's: `(None, true)` when it is
/// a pipe, a socket (`podman run -i`) or the container's terminal (`-it`),
/// which stream to the command as it runs; otherwise read to its end (the
/// engine sends it whole).
fn stdin(container: &Container) -> Result<(Option<Vec<u8>>, bool), String> {
    let stdin = std::io::stdin();
    if container.plan.terminal || stdin.is_terminal() || live_stdin::streams() {
        return Ok((None, true));
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .read_to_end(&mut bytes)
        .map_err(|error| format!("cannot read the container's standard input: {error}"))?;
    Ok(((!bytes.is_empty()).then_some(bytes), false))
}

fn run_options(container: &Container) -> RunOptions {
    let plan = &container.plan;
    let command = plan.args.iter().map(OsString::from).collect();
    let defaults = RunOptions::new(container.disk.clone(), command);
    RunOptions {
        env: plan.env.clone(),
        cwd: plan.cwd.clone(),
        user: plan.user.clone(),
        hostname: plan.hostname.clone(),
        rlimits: plan.rlimits.iter().map(bundle::rlimit).collect(),
        inputs: plan
            .host_folders()
            .map(|(host, guest)| Input {
                host: host.clone(),
                guest: guest.clone(),
            })
            .collect(),
        // A read-write volume comes back, replacing the host's folder, as
        // if the command had written there.
        outputs: plan
            .volumes
            .iter()
            .map(|(host, guest)| Output {
                guest: guest.clone(),
                host: host.clone(),
            })
            .collect(),
        force_outputs: true,
        cpus: plan.cpus.unwrap_or(defaults.cpus),
        memory_mib: plan.memory_mib.unwrap_or(defaults.memory_mib),
        // Side by side where nothing is recorded, as `provm run` does.
        parallel: container.trace.is_none(),
        timeout: TIMEOUT,
        container: Some(ImageOrigin {
            reference: ImageRef::Disk(PathBuf::from(&container.image_name)),
            digest: container.image_digest.clone(),
            digest_kind: match container.digest_of_root {
                true => DigestKind::RootDirectory,
                false => DigestKind::Manifest,
            },
            config: ContainerConfig::default(),
        }),
        ..defaults
    }
}
