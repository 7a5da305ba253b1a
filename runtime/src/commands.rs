//! The lifecycle's commands, each refusing what its container's state
//! does not allow with what to do instead, and writing nothing then.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use provm_engine::image::root_dir;
use provm_engine::kernel;

use crate::bundle::{self, Plan};
use crate::cli::{CreateArgs, LogFormat};
use crate::config;
use crate::console;
use crate::fds;
use crate::fifo;
use crate::image;
use crate::log::{self, Log};
use crate::signals;
use crate::state::{self, Container, Containers, Process, Status, FIFO};

/// The global options a command passes on to the container's process.
pub struct Globals<'a> {
    pub root: &'a Path,
    pub log: Option<&'a Path>,
    pub log_format: LogFormat,
    pub debug: bool,
}

/// `create`: checks the bundle, makes the root's disk, starts the
/// container's process (which waits for `start`) and writes its PID.
pub fn create(
    globals: &Globals,
    args: &CreateArgs,
    log: &Log,
    containers: &Containers,
) -> Result<Child, String> {
    let read = bundle::read(&args.bundle)?;
    for warning in &read.warnings {
        log.warn(warning);
    }
    let plan = read.plan;
    if plan.terminal && args.console_socket.is_none() {
        return Err("process.terminal is true, and no --console-socket was given to send the terminal to: pass one, or set terminal to false".into());
    }
    let id = &args.id;
    let trace = match plan.recorded() {
        true => Some(config::trace_for(id)?),
        false => None,
    };
    // A node without the guest kernel refuses the container here, not
    // after `start`, naming the command that builds it.
    kernel::find(kernel::Variant::for_cpus(plan.cpus.unwrap_or(1)))
        .map_err(|error| error.to_string())?;
    let root =
        root_dir::resolve(&plan.rootfs, &plan.placeholders()).map_err(|error| error.to_string())?;
    let dir = containers.claim(id)?;
    let created = start_process(globals, args, plan, root, trace, &dir);
    if created.is_err() {
        std::fs::remove_dir_all(&dir).ok();
    }
    created
}

/// The state folder's files and the container's process.
fn start_process(
    globals: &Globals,
    args: &CreateArgs,
    plan: Plan,
    root: root_dir::RootDisk,
    trace: Option<PathBuf>,
    dir: &Path,
) -> Result<Child, String> {
    let (image_name, image_digest, digest_of_root) =
        image::named(&args.id, &plan.annotations, &root.digest);
    let terminal = plan.terminal;
    let container = Container {
        id: args.id.clone(),
        bundle: absolute(&args.bundle)?,
        plan,
        disk: root.disk,
        image_name,
        image_digest,
        digest_of_root,
        trace,
    };
    state::write_json(&dir.join(state::CONTAINER_FILE), &container)?;
    fifo::make(&dir.join(FIFO)).map_err(|error| format!("cannot make the start FIFO: {error}"))?;
    let mut command = Command::new(
        std::env::current_exe().map_err(|error| format!("cannot find this program: {error}"))?,
    );
    command.arg("--root").arg(globals.root);
    if let Some(log) = globals.log {
        command.arg("--log").arg(log);
    }
    let format = match globals.log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    command.args(["--log-format", format]);
    if globals.debug {
        command.arg("--debug");
    }
    command.args(["init", &args.id]);
    if terminal {
        let socket = args.console_socket.as_ref().expect("checked by create");
        let pty = console::open().map_err(|error| format!("cannot make a terminal: {error}"))?;
        console::send(socket, &pty.master)?;
        // The slave is the container's process's streams and, as runc's,
        // its controlling terminal: the terminal's new sizes (SIGWINCH)
        // and hangup come to it, and it passes them to the guest.
        provm_guest_agent::pty::attach(&mut command, pty.slave.as_fd())
            .map_err(|error| format!("cannot share the terminal: {error}"))?;
    }
    fds::close_inherited_on_exec()
        .map_err(|error| format!("cannot close the engine's descriptors: {error}"))?;
    let child = command
        .spawn()
        .map_err(|error| format!("cannot start the container's process: {error}"))?;
    let pid = child.id() as i32;
    let process = Process {
        pid,
        start_time: state::start_time(pid).ok_or("the container's process ended at once")?,
        created: log::now(),
    };
    state::write_json(&dir.join(state::STATE_FILE), &process)?;
    if let Some(pid_file) = &args.pid_file {
        write_pid_file(pid_file, pid)?;
    }
    Ok(child)
}

/// The PID file, written whole (conmon reads it as soon as it appears).
fn write_pid_file(path: &Path, pid: i32) -> Result<(), String> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, pid.to_string())
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|error| format!("cannot write the PID file {}: {error}", path.display()))
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|error| format!("{}: {error}", path.display()))
}

/// `start`: the created container's command runs.
pub fn start(containers: &Containers, id: &str) -> Result<(), String> {
    let process = containers.process(id)?;
    match containers.status(id, &process) {
        Status::Created => {}
        Status::Running => return Err(format!("container {id} is running already")),
        Status::Stopped => {
            return Err(format!(
                "container {id} is stopped: a container starts once; delete it and create it again"
            ))
        }
    }
    fifo::start(&containers.dir(id).join(FIFO), || {
        containers.status(id, &process) != Status::Stopped
    })
}

/// `kill`: the signal goes to the container's process, which passes
/// SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to the
/// recorded command in the guest (`signals::forward_into_the_guest`).
pub fn kill(containers: &Containers, id: &str, signal: &str) -> Result<(), String> {
    let signal = signals::parse(signal)?;
    let process = containers.process(id)?;
    if containers.status(id, &process) == Status::Stopped {
        return Err(format!(
            "container {id} is not running: it has nothing to signal"
        ));
    }
    signals::send(process.pid, signal)
}

/// `delete`: forgets a stopped container; `--force` kills it first.
pub fn delete(containers: &Containers, id: &str, force: bool, log: &Log) -> Result<(), String> {
    if force && !containers.dir(id).exists() {
        return Ok(());
    }
    containers.container(id)?;
    match containers.process(id) {
        Ok(process) if containers.status(id, &process) != Status::Stopped => {
            if !force {
                return Err(format!(
                    "container {id} is {}: stop it first (provm-runtime kill {id}), or pass --force",
                    containers.status(id, &process).name()
                ));
            }
            signals::send(process.pid, libc::SIGKILL)?;
            wait_until_stopped(containers, id, &process)?;
        }
        // Stopped, or created only halfway: nothing runs.
        _ => {}
    }
    if let Some(trace) = containers.container(id)?.trace {
        recover_killed_recording(&trace, log);
    }
    containers.remove(id)
}

/// A container process killed outright (`delete --force`, an engine's or
/// Slurm's SIGKILL) left its recording unfinished: its trace is made of
/// what it wrote, cut short there (`provm recover`'s work).
fn recover_killed_recording(trace: &Path, log: &Log) {
    if trace.exists() {
        return;
    }
    let Some(partial) = provm_engine::recover::partials_of(trace).into_iter().next() else {
        return;
    };
    match provm_engine::recover::recover(&partial, trace) {
        Ok(recovered) => log.warn(&format!(
            "the container's recording was killed; {} holds its first {} events, cut short",
            recovered.trace.display(),
            recovered.events
        )),
        Err(error) => log.warn(&format!(
            "the container's recording was killed and cannot be recovered: {error}"
        )),
    }
}

fn wait_until_stopped(containers: &Containers, id: &str, process: &Process) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while containers.status(id, process) != Status::Stopped {
        if Instant::now() > deadline {
            return Err(format!(
                "container {id}'s process {} did not end",
                process.pid
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// `run`: create, start and (unless `detach`) wait; the command's status,
/// and the container deleted when it has ended (its recording's trace
/// made, if its process was killed outright).
pub fn run(
    globals: &Globals,
    args: &CreateArgs,
    detach: bool,
    log: &Log,
    containers: &Containers,
) -> Result<i32, String> {
    let mut child = create(globals, args, log, containers)?;
    if let Err(error) = start(containers, &args.id) {
        delete(containers, &args.id, true, log).ok();
        return Err(error);
    }
    if detach {
        return Ok(0);
    }
    signals::forward_to(child.id() as i32)?;
    let status = child
        .wait()
        .map_err(|error| format!("cannot wait for the container's process: {error}"))?;
    // As `delete`, so that a process killed outright leaves its trace:
    // Slurm, whose only command is `run`, never calls `delete`.
    delete(containers, &args.id, false, log)?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1))
}

/// `features`: runtime-spec's features document.
pub fn features() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.2.0",
        "hooks": [],
        "mountOptions": ["bind", "rbind", "ro"],
        "annotations": {
            bundle::RECORD_ANNOTATION: "false turns recording off for the container"
        }
    })
}
