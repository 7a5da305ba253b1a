//! The task events containerd hears from the shim (created, started,
//! exited, deleted), published to its event service.

use containerd_shim::event::Event;
use containerd_shim::synchronous::publisher::RemotePublisher;
use containerd_shim::{warn, Context};

pub struct Events {
    publisher: RemotePublisher,
    namespace: String,
}

impl Events {
    pub fn new(publisher: RemotePublisher, namespace: &str) -> Events {
        Events {
            publisher,
            namespace: namespace.to_owned(),
        }
    }

    /// Publishes `event`; one containerd did not take is logged, as the
    /// task's own calls (Wait, State) still tell what it says.
    pub fn publish(&self, event: impl Event + 'static) {
        let topic = event.topic();
        if let Err(error) =
            self.publisher
                .publish(Context::default(), &topic, &self.namespace, Box::new(event))
        {
            warn!("cannot publish the event {topic}: {error}");
        }
    }
}
