//! `provm export files`: what a recorded run copied back to the host
//! (`record --output`), out of its trace. The guest sent those files over
//! the agent channel, so they are in the log as it sent them, and a replay
//! checks them byte for byte; nothing is replayed here.

use std::path::Path;

use provm_engine::transfer::{Delivered, Output, OutputSink};
use provm_guest_agent::{FrameReader, GuestMessage, HostMessage};
use provm_trace::events::Event;
use provm_trace::reader::Trace;

use super::ExportError;

/// Writes what the run `trace` left at `guest_path` to `host` (a directory
/// or a file, as it was in the guest), replacing `host` only with `force`.
pub fn files(
    trace: &Path,
    guest_path: &str,
    host: &Path,
    force: bool,
) -> Result<Delivered, ExportError> {
    let output = Output::parse(&format!("{guest_path}:{}", host.display()))
        .map_err(|error| ExportError::Files(error.to_string()))?;
    let mut sink = OutputSink::new(std::slice::from_ref(&output), force)
        .map_err(|error| ExportError::Files(error.to_string()))?;
    let trace = Trace::open(trace)?;
    let mut events = trace.events()?;
    let (mut tree, mut outputs) = (None, Vec::new());
    let mut frames = FrameReader::default();
    while let Some(event) = events.next_event()? {
        match event {
            Event::AgentInput(bytes) if tree.is_none() => {
                if let Some(HostMessage::Run(job)) = HostMessage::of_frame(&bytes) {
                    outputs = job.outputs;
                    tree = outputs
                        .iter()
                        .position(|path| path == output.guest.as_bytes());
                }
            }
            Event::AgentOutput(bytes) => frames.push(&bytes),
            _ => {}
        }
        while let Some((kind, payload)) = frames.next_frame().map_err(malformed)? {
            if let Ok(GuestMessage::Entry(mut entry)) = GuestMessage::decode(kind, &payload) {
                if Some(entry.tree as usize) == tree {
                    entry.tree = 0;
                    sink.take(entry)
                        .map_err(|error| ExportError::Files(error.to_string()))?;
                }
            }
        }
    }
    if tree.is_none() {
        let copied: Vec<_> = outputs
            .iter()
            .map(|path| String::from_utf8_lossy(path).into_owned())
            .collect();
        return Err(ExportError::Files(match copied.as_slice() {
            [] => format!("the run copied nothing back to the host: record with --output {guest_path}:HOST_PATH to keep what the command leaves there"),
            copied => format!("the run did not copy {guest_path} back; it copied {}", copied.join(", ")),
        }));
    }
    let (_, delivered) = sink
        .commit()
        .map_err(|error| ExportError::Files(error.to_string()))?
        .pop()
        .expect("one output");
    if delivered.missing {
        return Err(ExportError::Files(format!(
            "the command left nothing at {guest_path}, so the run copied nothing back"
        )));
    }
    Ok(delivered)
}

fn malformed(error: provm_guest_agent::DecodeError) -> ExportError {
    ExportError::Files(format!("the trace's agent output is malformed: {error}"))
}
