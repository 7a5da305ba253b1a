//! The shim's one container, through its life: its root mounted, its
//! process created with the streams containerd gave, started, signalled,
//! waited for and deleted, each step provm-runtime's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::api::CreateTaskRequest;

use crate::exit::{Exit, Exited};
use crate::rootfs;
use crate::runtime::Runtime;
use crate::stdio;

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub pid: i32,
    pub exit: Arc<Exit>,
    runtime: Runtime,
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
        let created =
            stdio::open(&request.stdin, &request.stdout, &request.stderr).and_then(|streams| {
                let runtime = Runtime::for_bundle(&bundle);
                runtime
                    .create(&request.id, &bundle, streams)
                    .map(|pid| (runtime, pid))
            });
        let (runtime, pid) = created.inspect_err(|_| {
            rootfs::unmount(&bundle).ok();
        })?;
        Ok(Container {
            id: request.id.clone(),
            exit: Exit::watch(pid, ended),
            bundle,
            pid,
            runtime,
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
