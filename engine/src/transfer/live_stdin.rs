//! Standard input that streams to the command as it runs (provm's own is a
//! pipe or a socket): a thread reads it in chunks into a short queue, and
//! the session sends them to the agent while the job runs, each at a point
//! the recording logs as the host's input (see `HostRequests`), so that a
//! replay sends them where they were sent.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex};

use provm_guest_agent::HostMessage;
use provm_seams::HostRequests;

/// Most bytes in one Stdin message: the session keeps `DATA_WINDOW` (16)
/// in flight, 64 KiB, what the command's pipe in the guest holds.
const CHUNK: usize = 4096;

/// Chunks read ahead of the guest: past these, the reader waits, and so
/// does whatever writes to provm's standard input.
const READ_AHEAD: usize = 16;

/// The reader of provm's standard input, and the chunks it has read.
pub struct LiveStdin {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled as chunks are taken: the reader may go on.
    room: Condvar,
}

#[derive(Default)]
struct State {
    chunks: VecDeque<Vec<u8>>,
    /// At end of file (or a read error, said as a notice).
    ended: bool,
    /// Whom to tell as chunks come, while a job takes them.
    requests: Option<&'static HostRequests>,
}

impl LiveStdin {
    /// Starts reading provm's standard input.
    pub fn start() -> std::io::Result<LiveStdin> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            room: Condvar::new(),
        });
        let reading = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || reading.read_all())?;
        Ok(LiveStdin { shared })
    }

    /// Starts giving the chunks to a job: `requests` hears of each as it
    /// comes, until the feed is dropped.
    pub fn feed(&self, requests: &'static HostRequests) -> Feed<'_> {
        let mut state = self.shared.state.lock().unwrap();
        state.requests = Some(requests);
        if state.ended || !state.chunks.is_empty() {
            requests.stdin_came();
        }
        Feed {
            stdin: self,
            requests,
            end_sent: false,
        }
    }
}

/// Whether provm's standard input is a pipe or a socket: it may stay open
/// long after its first bytes (`yes | provm record ...`), so the command
/// should get it as it comes.
pub fn streams() -> bool {
    use std::os::unix::fs::FileTypeExt;
    let stdin = std::os::fd::AsFd::as_fd(&std::io::stdin()).try_clone_to_owned();
    stdin
        .map(std::fs::File::from)
        .and_then(|stdin| stdin.metadata())
        .is_ok_and(|metadata| {
            let kind = metadata.file_type();
            kind.is_fifo() || kind.is_socket()
        })
}

impl Shared {
    fn read_all(&self) {
        let mut buffer = vec![0; CHUNK];
        loop {
            let chunk = match std::io::stdin().read(&mut buffer) {
                Ok(0) => None,
                Ok(len) => Some(buffer[..len].to_vec()),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    crate::notice!("cannot read the standard input, ended there: {error}");
                    None
                }
            };
            let mut state = self.state.lock().unwrap();
            while state.chunks.len() >= READ_AHEAD {
                state = self.room.wait(state).unwrap();
            }
            let ended = chunk.is_none();
            match chunk {
                Some(chunk) => state.chunks.push_back(chunk),
                None => state.ended = true,
            }
            if let Some(requests) = state.requests {
                requests.stdin_came();
            }
            if ended {
                return;
            }
        }
    }
}

/// A job's take of the live standard input.
pub struct Feed<'a> {
    stdin: &'a LiveStdin,
    requests: &'static HostRequests,
    end_sent: bool,
}

impl Feed<'_> {
    /// The messages to send now: up to `room` Stdin messages (each
    /// acknowledged), then StdinEnd once, after the last.
    pub fn messages(&mut self, room: usize) -> Vec<HostMessage> {
        let shared = &self.stdin.shared;
        let mut state = shared.state.lock().unwrap();
        let taken = room.min(state.chunks.len());
        let mut messages: Vec<_> = state
            .chunks
            .drain(..taken)
            .map(HostMessage::Stdin)
            .collect();
        if taken > 0 {
            shared.room.notify_one();
        }
        if state.ended && state.chunks.is_empty() && !self.end_sent {
            messages.push(HostMessage::StdinEnd);
            self.end_sent = true;
        }
        messages
    }
}

impl Drop for Feed<'_> {
    /// The job has ended: what comes now waits for none, and stops no guest.
    fn drop(&mut self) {
        self.stdin.shared.state.lock().unwrap().requests = None;
        self.requests.take_stdin();
    }
}
