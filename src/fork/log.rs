//! What a fork needs to know of the recording's log before it starts: how
//! long it is, where the host sent the job and the power-off, where each
//! disk write was submitted, and what the command printed.

use provm_guest_agent::{HostMessage, Job};
use provm_trace::events::Event;
use provm_trace::format::FormatError;
use provm_trace::reader::Trace;

use crate::agent_outputs::AgentOutputs;

/// The recording's log, read once.
pub struct LogSummary {
    pub events: u64,
    /// The job the host sent, and the index of its event.
    pub job: Option<(u64, Job)>,
    /// The job's data messages (inputs, standard input), as logged.
    pub data: Vec<Vec<u8>>,
    /// For each disk write, the index of the VM exit that submitted it.
    pub disk_write_exits: Vec<u64>,
    /// What the recorded command printed, and how it ended.
    pub outputs: AgentOutputs,
}

impl LogSummary {
    pub fn read(trace: &Trace) -> Result<LogSummary, FormatError> {
        let mut events = trace.events()?;
        let mut summary = LogSummary {
            events: 0,
            job: None,
            data: Vec::new(),
            disk_write_exits: Vec::new(),
            outputs: AgentOutputs::default(),
        };
        let mut last_exit = 0;
        while let Some(event) = events.next_event()? {
            let index = summary.events;
            summary.events += 1;
            match event {
                _ if event.is_exit() => last_exit = index,
                Event::DiskWrite { .. } => summary.disk_write_exits.push(last_exit),
                Event::AgentOutput(bytes) => summary.outputs.push(&bytes),
                Event::AgentInput(bytes) => match HostMessage::of_frame(&bytes) {
                    Some(HostMessage::Run(job)) if summary.job.is_none() => {
                        summary.job = Some((index, job))
                    }
                    Some(message) if message.is_data() => summary.data.push(bytes),
                    _ => {}
                },
                _ => {}
            }
        }
        Ok(summary)
    }
}
