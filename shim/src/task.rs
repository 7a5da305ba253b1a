//! containerd's Task API, as `ctr run` and the CRI use it for a container
//! of one process: each call answered from the shim's container, and
//! what a VM that runs one command cannot do refused, saying why.

use std::sync::{Arc, Mutex};

use containerd_shim::api::{self, Empty};
use containerd_shim::protos::api::ProcessInfo;
use containerd_shim::protos::events::task::{TaskCreate, TaskDelete, TaskExit, TaskIO, TaskStart};
use containerd_shim::protos::protobuf::EnumOrUnknown;
use containerd_shim::protos::ttrpc::{self, get_status, Code};
use containerd_shim::{ExitSignal, TtrpcContext, TtrpcResult};

use crate::container::{Container, Status};
use crate::events::Events;

pub struct TaskService {
    events: Arc<Events>,
    container: Mutex<Option<Container>>,
    shutdown: Arc<ExitSignal>,
}

impl TaskService {
    pub fn new(events: Events, shutdown: Arc<ExitSignal>) -> TaskService {
        TaskService {
            events: Arc::new(events),
            container: Mutex::new(None),
            shutdown,
        }
    }

    /// `act` on the container `id`, which this shim must hold, for its own
    /// process (a second one, an exec's, is refused).
    fn with_container<T>(
        &self,
        id: &str,
        exec_id: &str,
        act: impl FnOnce(&Container) -> TtrpcResult<T>,
    ) -> TtrpcResult<T> {
        only_the_container(exec_id)?;
        match self.container.lock().unwrap().as_ref() {
            Some(container) if container.id == id => act(container),
            _ => Err(status(
                Code::NOT_FOUND,
                format!("no container {id} in this shim"),
            )),
        }
    }
}

fn status(code: Code, message: String) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(get_status(code, message))
}

fn failed(message: String) -> ttrpc::Error {
    status(Code::UNKNOWN, message)
}

/// What provm cannot do to a container, named, with why.
fn refused<T>(what: &str, why: &str) -> TtrpcResult<T> {
    Err(status(
        Code::UNIMPLEMENTED,
        format!("{what} is not supported by provm's runtime: {why}"),
    ))
}

const ONE_COMMAND: &str =
    "a container's VM runs its one command, and another process cannot join it; run another container instead";

/// A second process (an exec's id) is refused; the container's own has none.
fn only_the_container(exec_id: &str) -> TtrpcResult<()> {
    match exec_id {
        "" => Ok(()),
        _ => refused("exec", ONE_COMMAND),
    }
}

impl containerd_shim::Task for TaskService {
    fn connect(
        &self,
        _: &TtrpcContext,
        _: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let container = self.container.lock().unwrap();
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: container.as_ref().map_or(0, |c| c.pid as u32),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            ..Default::default()
        })
    }

    fn create(
        &self,
        _: &TtrpcContext,
        request: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        if !request.checkpoint.is_empty() {
            return refused(
                "restoring a checkpoint",
                "a recording is replayed with `provm replay`",
            );
        }
        let mut held = self.container.lock().unwrap();
        if let Some(other) = held.as_ref() {
            return Err(status(
                Code::ALREADY_EXISTS,
                format!(
                    "this shim holds container {} already: one container a shim",
                    other.id
                ),
            ));
        }
        let events = self.events.clone();
        let id = request.id.clone();
        let container = Container::create(&request, move |exited| {
            events.publish(TaskExit {
                container_id: id.clone(),
                id: id.clone(),
                pid: exited.pid,
                exit_status: exited.status,
                exited_at: Some(exited.at.clone()).into(),
                ..Default::default()
            })
        })
        .map_err(failed)?;
        let pid = container.pid as u32;
        self.events.publish(TaskCreate {
            container_id: request.id.clone(),
            bundle: request.bundle.clone(),
            rootfs: request.rootfs.clone(),
            io: Some(TaskIO {
                stdin: request.stdin.clone(),
                stdout: request.stdout.clone(),
                stderr: request.stderr.clone(),
                terminal: request.terminal,
                ..Default::default()
            })
            .into(),
            pid,
            ..Default::default()
        });
        *held = Some(container);
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    fn start(
        &self,
        _: &TtrpcContext,
        request: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        let pid = self.with_container(&request.id, &request.exec_id, |container| {
            container.start().map_err(failed)?;
            Ok(container.pid as u32)
        })?;
        self.events.publish(TaskStart {
            container_id: request.id.clone(),
            pid,
            ..Default::default()
        });
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn state(
        &self,
        _: &TtrpcContext,
        request: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        self.with_container(&request.id, &request.exec_id, |container| {
            let status = match container.status().map_err(failed)? {
                Status::Created => api::Status::CREATED,
                Status::Running => api::Status::RUNNING,
                Status::Stopped => api::Status::STOPPED,
            };
            let exited = container.exit.now();
            Ok(api::StateResponse {
                id: container.id.clone(),
                bundle: container.bundle.display().to_string(),
                pid: container.pid as u32,
                status: EnumOrUnknown::new(status),
                exit_status: exited.as_ref().map_or(0, |e| e.status),
                exited_at: exited.map(|e| e.at).into(),
                ..Default::default()
            })
        })
    }

    fn kill(&self, _: &TtrpcContext, request: api::KillRequest) -> TtrpcResult<Empty> {
        self.with_container(&request.id, &request.exec_id, |container| {
            if container.exit.now().is_some() {
                // As runc's shim says it: containerd takes it as done.
                return Err(status(Code::NOT_FOUND, "process already finished".into()));
            }
            container.kill(request.signal, request.all).map_err(failed)
        })?;
        Ok(Empty::new())
    }

    fn wait(&self, _: &TtrpcContext, request: api::WaitRequest) -> TtrpcResult<api::WaitResponse> {
        // Waited for without the container's lock: kill and state come
        // meanwhile.
        let exit = self.with_container(&request.id, &request.exec_id, |container| {
            Ok(container.exit.clone())
        })?;
        let exited = exit.wait();
        Ok(api::WaitResponse {
            exit_status: exited.status,
            exited_at: Some(exited.at).into(),
            ..Default::default()
        })
    }

    fn delete(
        &self,
        _: &TtrpcContext,
        request: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        let exited = self.with_container(&request.id, &request.exec_id, |container| {
            container
                .delete()
                .map_err(|error| status(Code::FAILED_PRECONDITION, error))
        })?;
        *self.container.lock().unwrap() = None;
        self.events.publish(TaskDelete {
            container_id: request.id.clone(),
            id: request.id.clone(),
            pid: exited.pid,
            exit_status: exited.status,
            exited_at: Some(exited.at.clone()).into(),
            ..Default::default()
        });
        Ok(api::DeleteResponse {
            pid: exited.pid,
            exit_status: exited.status,
            exited_at: Some(exited.at).into(),
            ..Default::default()
        })
    }

    fn pids(&self, _: &TtrpcContext, request: api::PidsRequest) -> TtrpcResult<api::PidsResponse> {
        let pid = self.with_container(&request.id, "", |container| Ok(container.pid as u32))?;
        Ok(api::PidsResponse {
            processes: vec![ProcessInfo {
                pid,
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn close_io(&self, _: &TtrpcContext, _: api::CloseIORequest) -> TtrpcResult<Empty> {
        // The container's standard input ends when the client closes its
        // end of the FIFO: nothing is left to close here.
        Ok(Empty::new())
    }

    fn shutdown(&self, _: &TtrpcContext, _: api::ShutdownRequest) -> TtrpcResult<Empty> {
        // As runc's shim: it stays while it holds a container.
        if self.container.lock().unwrap().is_none() {
            self.shutdown.signal();
        }
        Ok(Empty::new())
    }

    fn exec(&self, _: &TtrpcContext, _: api::ExecProcessRequest) -> TtrpcResult<Empty> {
        refused("exec", ONE_COMMAND)
    }

    fn pause(&self, _: &TtrpcContext, _: api::PauseRequest) -> TtrpcResult<Empty> {
        refused(
            "pause",
            "a recording cannot stop its guest's clock and go on later",
        )
    }

    fn resume(&self, _: &TtrpcContext, _: api::ResumeRequest) -> TtrpcResult<Empty> {
        refused("resume", "a container is never paused")
    }

    fn checkpoint(&self, _: &TtrpcContext, _: api::CheckpointTaskRequest) -> TtrpcResult<Empty> {
        refused(
            "checkpoint",
            "the container's recording is its record: replay it with `provm replay`",
        )
    }

    fn update(&self, _: &TtrpcContext, _: api::UpdateTaskRequest) -> TtrpcResult<Empty> {
        refused(
            "update",
            "a VM's CPUs and memory are fixed when it starts; create the container with them",
        )
    }

    fn resize_pty(&self, _: &TtrpcContext, request: api::ResizePtyRequest) -> TtrpcResult<Empty> {
        self.with_container(&request.id, &request.exec_id, |container| {
            container
                .resize(request.width, request.height)
                .map_err(|error| status(Code::FAILED_PRECONDITION, error))
        })?;
        Ok(Empty::new())
    }

    fn stats(&self, _: &TtrpcContext, _: api::StatsRequest) -> TtrpcResult<api::StatsResponse> {
        refused("stats", "a container's VM has no host cgroup to measure")
    }
}
