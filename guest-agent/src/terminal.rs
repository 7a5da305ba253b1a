//! The command's terminal in the guest (a container's `process.terminal`):
//! a pseudo-terminal whose slave is the command's standard input, output
//! and error and its controlling terminal, so that a shell prompts, lines
//! are edited and echoed, and Ctrl-C interrupts, in the guest, as they
//! would on the host. The agent reads the master for the command's output
//! and writes the host's live input to it.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::process::Command;

use crate::stdin_pipe::StdinPipe;
use provm_guest_agent::{pty, WindowSize};

/// The terminal's master, and its slave until the command has it.
pub struct Terminal {
    master: File,
    slave: Option<File>,
}

impl Terminal {
    /// A new pseudo-terminal of `size`.
    pub fn open(size: WindowSize) -> io::Result<Terminal> {
        let (master, slave) = pty::open(Some(size))?;
        Ok(Terminal {
            master: File::from(master),
            slave: Some(File::from(slave)),
        })
    }

    /// Gives `command` the slave as its standard streams and its
    /// controlling terminal, in a session of its own.
    pub fn attach(&self, command: &mut Command) -> io::Result<()> {
        let slave = self
            .slave
            .as_ref()
            .expect("the slave is kept until spawned");
        pty::attach(command, slave.as_fd())
    }

    /// Closes the agent's slave once the command has it: the master then
    /// reads end of file (EIO) when the command and all it started have
    /// closed theirs.
    pub fn spawned(&mut self) {
        self.slave = None;
    }

    /// Gives the terminal a new size: its foreground processes get
    /// SIGWINCH, as on the host.
    pub fn resize(&self, size: WindowSize) -> io::Result<()> {
        pty::resize(self.master.as_fd(), size)
    }

    /// The master, to read the command's output from.
    pub fn output(&self) -> io::Result<File> {
        self.master.try_clone()
    }

    /// The host's live input, written to the master as if typed.
    pub fn input(&self) -> io::Result<StdinPipe> {
        StdinPipe::writing_to(self.master.try_clone()?)
    }
}
