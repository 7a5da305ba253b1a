//! The shim's own life, as containerd drives it: `start` (a serving shim
//! for the container, which prints its address), the TTRPC server's task
//! service, and `delete`, the cleanup containerd asks for when a shim died.

use std::sync::Arc;

use containerd_shim::synchronous::publisher::RemotePublisher;
use containerd_shim::synchronous::util::write_address;
use containerd_shim::{api, Config, Error, ExitSignal, Flags, StartOpts};

use crate::container;
use crate::events::Events;
use crate::exit;
use crate::task::TaskService;

pub struct Service {
    id: String,
    namespace: String,
    exit: Arc<ExitSignal>,
}

impl containerd_shim::Shim for Service {
    type T = TaskService;

    fn new(_runtime_id: &str, flags: &Flags, _config: &mut Config) -> Self {
        Service {
            id: flags.id.clone(),
            namespace: flags.namespace.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> Result<String, Error> {
        // One shim per container: its id groups no other.
        let (_pid, address) = containerd_shim::spawn(opts, &self.id, Vec::new())?;
        // In the bundle (the working folder), where the serving shim reads
        // it back to remove its socket when it ends.
        write_address(&address)?;
        Ok(address)
    }

    fn delete_shim(&mut self) -> Result<api::DeleteResponse, Error> {
        let bundle = std::env::current_dir()
            .map_err(|error| Error::Other(format!("cannot find the bundle: {error}")))?;
        container::clean_up_after_a_dead_shim(&self.id, &bundle).map_err(Error::Other)?;
        Ok(api::DeleteResponse {
            exit_status: exit::KILLED,
            exited_at: Some(containerd_shim::util::timestamp()?).into(),
            ..Default::default()
        })
    }

    fn wait(&mut self) {
        self.exit.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> TaskService {
        let events = Events::new(publisher, &self.namespace);
        TaskService::new(events, self.exit.clone())
    }
}
