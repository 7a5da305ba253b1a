//! The shim's one container, through its life: its root mounted, its
//! process created with the streams containerd gave (or a terminal
//! copied to and from them), started, signalled,
//! waited for and deleted, each step provm-runtime's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use containerd_shim::api::CreateTaskRequest;

use crate::console::{Console, ConsoleSocket};
use crate::exit::{Exit, Exited};
use crate::rootfs;
use crate::runtime::Runtime;
use crate::stdio::{self, Streams};

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub pid: i32,
    pub exit: Arc<Exit>,
    runtime: Runtime,
    /// Its terminal, if it was created with one.
    console: Option<Console>,
}

/// The container's process, created: its PID, and its terminal with the
/// thread that copies the terminal's output, if it has one.
struct Created {
    runtime: Runtime,
    pid: i32,
    terminal: Option<(Console, JoinHandle<()>)>,
}

/// What a container is: created, running, or stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

impl Container {
    /// Creates the container `request` describes; `ended` is called when
    /// its process has ended.
    pub fn create(
        request: &CreateTaskRequest,
        ended: impl FnOnce(&Exited) + Send + 'static,
    ) -> Result<Container, String> {
        let bundle = PathBuf::from(&request.bundle);
        rootfs::mount(&request.rootfs, &bundle)?;
        let created = Self::create_process(request, &bundle).inspect_err(|_| {
            rootfs::unmount(&bundle).ok();
        })?;
        let (console, output) = created.terminal.unzip();
        Ok(Container {
            id: request.id.clone(),
            exit: Exit::watch(created.pid, output, ended),
            bundle,
            pid: created.pid,
            runtime: created.runtime,
            console,
        })
    }

    /// provm-runtime's `create` of the container's process, with the
    /// streams containerd gave, or a terminal copied to and from them.
    fn create_process(request: &CreateTaskRequest, bundle: &Path) -> Result<Created, String> {
        let streams = stdio::open(&request.stdin, &request.stdout, &request.stderr)?;
        let runtime = Runtime::for_bundle(bundle);
        if !request.terminal {
            let pid = runtime.create(&request.id, bundle, streams, None)?;
            return Ok(Created {
                runtime,
                pid,
                terminal: None,
            });
        }
        let socket = ConsoleSocket::bind()?;
        let pid = runtime.create(&request.id, bundle, Streams::none()?, Some(socket.path()))?;
        let terminal = Console::attach(socket.receive()?, streams.stdin, streams.stdout)?;
        Ok(Created {
            runtime,
            pid,
            terminal: Some(terminal),
        })
    }

    pub fn start(&self) -> Result<(), String> {
        self.runtime.start(&self.id)
    }

    pub fn status(&self) -> Result<Status, String> {
        if self.exit.now().is_some() {
            return Ok(Status::Stopped);
        }
        Ok(match self.runtime.status(&self.id)?.as_str() {
            "created" => Status::Created,
            "running" => Status::Running,
            _ => Status::Stopped,
        })
    }

    /// Sets the size of the container's terminal; one without is refused.
    pub fn resize(&self, width: u32, height: u32) -> Result<(), String> {
        match &self.console {
            Some(console) => console.resize(width, height),
            None => Err(format!(
                "container {} has no terminal: create it with one (ctr run -t)",
                self.id
            )),
        }
    }

    pub fn kill(&self, signal: u32, all: bool) -> Result<(), String> {
        self.runtime.kill(&self.id, signal, all)
    }

    /// Forgets the stopped container (the runtime refuses a running one)
    /// and unmounts its root; how it ended.
    pub fn delete(&self) -> Result<Exited, String> {
        let exited = self.exit.now().ok_or_else(|| {
            format!(
                "container {} is running: stop it first (ctr task kill {})",
                self.id, self.id
            )
        })?;
        self.runtime.delete(&self.id, false)?;
        rootfs::unmount(&self.bundle)?;
        Ok(exited)
    }
}

/// After a shim died: the container `id` of `bundle` stopped and
/// forgotten (its recording's trace made of what it wrote), its root
/// unmounted.
pub fn clean_up_after_a_dead_shim(id: &str, bundle: &Path) -> Result<(), String> {
    Runtime::for_bundle(bundle).delete(id, true)?;
    rootfs::unmount(bundle)
}
