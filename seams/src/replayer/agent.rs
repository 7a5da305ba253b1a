//! The agent's frames: the replayed agent's output read as the host reads
//! it, to learn the command's exit status. The bytes themselves are
//! compared with the log like any output; this only decodes them.

use provm_guest_agent::{FrameReader, GuestMessage};

/// A checkpoint keeps it whole: a frame may straddle the pause.
#[derive(Clone, Default)]
pub(super) struct AgentFrames(FrameReader);

impl AgentFrames {
    /// The exit status the frames `bytes` complete report, if one does (the
    /// last, if several). A bad frame is said once: past it nothing can be
    /// read.
    pub(super) fn exit_status_in(&mut self, bytes: &[u8]) -> Option<i32> {
        let already_broken = self.0.is_broken();
        self.0.push(bytes);
        let mut exit_status = None;
        loop {
            match self.0.next_frame() {
                Ok(Some((kind, payload))) => {
                    if let Ok(GuestMessage::Finished(outcome)) =
                        GuestMessage::decode(kind, &payload)
                    {
                        exit_status = Some(outcome.shell_status());
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    if !already_broken {
                        tracing::warn!(
                            "the agent's output cannot be read past a bad frame ({error}): \
                             the replay compares its bytes but cannot tell the command's exit status"
                        );
                    }
                    break;
                }
            }
        }
        exit_status
    }
}
