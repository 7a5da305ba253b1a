//! The command's live standard input: a pipe the agent writes the host's
//! chunks to as they come, never blocking (PID 1 also forwards the
//! command's output and the host's signals meanwhile).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// The pipe's write end and the chunks not yet written to it.
pub struct StdinPipe {
    /// `None` once closed: at the end of the host's stdin, or when the
    /// command closed its end.
    pipe: Option<File>,
    pending: VecDeque<Vec<u8>>,
    /// Bytes of the first pending chunk already written.
    written: usize,
    /// The host's stdin has ended: close once the pending chunks are written.
    ending: bool,
}

impl StdinPipe {
    /// A pipe whose read end is the command's standard input.
    pub fn new() -> io::Result<(StdinPipe, File)> {
        let (read, write) = io::pipe()?;
        let pipe = StdinPipe::writing_to(File::from(OwnedFd::from(write)))?;
        Ok((pipe, File::from(OwnedFd::from(read))))
    }

    /// Writes to `file` instead (a terminal's master, which the command
    /// reads through its slave); closing it at the end closes this
    /// descriptor only.
    pub fn writing_to(file: File) -> io::Result<StdinPipe> {
        set_non_blocking(&file)?;
        Ok(StdinPipe {
            pipe: Some(file),
            pending: VecDeque::new(),
            written: 0,
            ending: false,
        })
    }

    /// Queues a chunk of the host's stdin.
    pub fn push(&mut self, chunk: Vec<u8>) {
        self.pending.push_back(chunk);
    }

    /// The host's stdin has ended.
    pub fn end(&mut self) {
        self.ending = true;
    }

    /// The descriptor to poll for room (POLLOUT): -1 when nothing waits to
    /// be written.
    pub fn fd(&self) -> RawFd {
        match &self.pipe {
            Some(pipe) if !self.pending.is_empty() => pipe.as_raw_fd(),
            _ => -1,
        }
    }

    /// Writes what the pipe takes now, closes it at the end; returns how
    /// many chunks were done with (written, or dropped because the command
    /// closed its end), each for a `Received` to the host.
    pub fn write(&mut self) -> io::Result<usize> {
        let mut done = 0;
        while let (Some(pipe), Some(chunk)) = (&mut self.pipe, self.pending.front()) {
            match pipe.write(&chunk[self.written..]) {
                Ok(len) => self.written += len,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(done),
                // The command will read no more: what is left is dropped.
                // (A terminal whose slave all have closed says EIO.)
                Err(error)
                    if error.kind() == io::ErrorKind::BrokenPipe
                        || error.raw_os_error() == Some(libc::EIO) =>
                {
                    self.pipe = None;
                    break;
                }
                Err(error) => return Err(error),
            }
            if self.written == chunk.len() {
                self.pending.pop_front();
                self.written = 0;
                done += 1;
            }
        }
        if self.pipe.is_none() {
            done += self.pending.len();
            self.pending.clear();
            self.written = 0;
        } else if self.ending && self.pending.is_empty() {
            self.pipe = None;
        }
        Ok(done)
    }
}

fn set_non_blocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(2) F_GETFL/F_SETFL only read and set the flags of the
    // open descriptor `fd`, which `file` keeps alive for the call.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn chunks_wait_for_room_and_the_pipe_closes_after_the_last() {
        let (mut pipe, mut read) = StdinPipe::new().unwrap();
        assert_eq!(pipe.fd(), -1, "nothing to write yet");
        // More than a pipe holds (64 KiB): the second chunk must wait.
        pipe.push(vec![b'a'; 60 * 1024]);
        pipe.push(vec![b'b'; 60 * 1024]);
        pipe.end();
        assert_eq!(pipe.write().unwrap(), 1);
        assert!(pipe.fd() >= 0, "the rest waits for room");
        let mut got = vec![0; 64 * 1024];
        read.read_exact(&mut got).unwrap();
        assert_eq!(pipe.write().unwrap(), 1);
        assert_eq!(pipe.fd(), -1);
        let mut rest = Vec::new();
        read.read_to_end(&mut rest).unwrap();
        assert_eq!(got.len() + rest.len(), 120 * 1024, "closed after the last");
        assert!(got.iter().chain(&rest).skip(60 * 1024).all(|&b| b == b'b'));
    }

    #[test]
    fn chunks_for_a_command_that_closed_its_stdin_are_dropped() {
        let (mut pipe, read) = StdinPipe::new().unwrap();
        drop(read);
        pipe.push(b"one\n".to_vec());
        pipe.push(b"two\n".to_vec());
        assert_eq!(pipe.write().unwrap(), 2, "both acknowledged");
        pipe.push(b"three\n".to_vec());
        assert_eq!(pipe.write().unwrap(), 1);
        assert_eq!(pipe.fd(), -1);
    }
}
