//! What a fork needs to know of the recording's log before it starts: how
//! long it is, where the host sent the job and the power-off, where each
//! disk write was submitted, and what the command printed.

use provm_guest_agent::{FrameReader, GuestMessage, HostMessage, Job, Outcome};
use provm_trace::events::Event;
use provm_trace::format::FormatError;
use provm_trace::reader::Trace;

/// What the agent said over a run: the command's output and how it ended.
#[derive(Default)]
pub struct AgentOutputs {
    frames: FrameReader,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub finished: Option<Outcome>,
    /// The agent could not run the command, or spoke out of turn.
    pub failed: Option<String>,
}

impl AgentOutputs {
    /// Takes in bytes the agent sent. After a bad frame nothing more can
    /// be read: the stream is failed, once.
    pub fn push(&mut self, bytes: &[u8]) {
        self.frames.push(bytes);
        loop {
            let message = match self.frames.next_frame() {
                Ok(Some((kind, payload))) => GuestMessage::decode(kind, &payload),
                Ok(None) => return,
                Err(error) => {
                    self.failed
                        .get_or_insert_with(|| format!("a malformed frame: {error}"));
                    return;
                }
            };
            match message {
                Ok(GuestMessage::Stdout(bytes)) => self.stdout.extend(bytes),
                Ok(GuestMessage::Stderr(bytes)) => self.stderr.extend(bytes),
                Ok(GuestMessage::Finished(outcome)) => self.finished = Some(outcome),
                Ok(
                    GuestMessage::Provenance(_)
                    | GuestMessage::Ready
                    | GuestMessage::Received
                    | GuestMessage::Entry(_),
                ) => {}
                Ok(GuestMessage::Failed(reason)) => {
                    self.failed = Some(String::from_utf8_lossy(&reason).into_owned())
                }
                Err(error) => self.failed = Some(format!("a malformed message: {error}")),
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A bad frame fails the outputs and returns (it used to read the same
    /// error for ever); what came before it is kept.
    #[test]
    fn a_bad_frame_fails_the_agents_outputs() {
        let mut outputs = AgentOutputs::default();
        outputs.push(&GuestMessage::Stdout(b"before".to_vec()).encode());
        // A header whose length is past any frame's.
        let mut bad = GuestMessage::Stdout(Vec::new()).encode();
        bad[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        outputs.push(&bad);
        outputs.push(&GuestMessage::Stdout(b"after".to_vec()).encode());
        assert_eq!(outputs.stdout, b"before");
        let failed = outputs.failed.expect("failed");
        assert!(failed.contains("malformed frame"), "{failed}");
    }
}
