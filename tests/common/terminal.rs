//! A program run on a terminal the test holds, as a user's shell would run
//! it: a pseudo-terminal whose slave is the program's streams and
//! controlling terminal, and whose master the test reads, types at and
//! resizes (which signals the program SIGWINCH, as a terminal window
//! does).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use provm_guest_agent::{pty, WindowSize};

pub struct OnATerminal {
    master: File,
    child: Child,
    /// What the program has written so far, read by a thread that ends
    /// once it and all it started have closed the terminal.
    output: Arc<Mutex<Vec<u8>>>,
    reader: JoinHandle<()>,
}

impl OnATerminal {
    /// Starts `command` on a new terminal of `rows` by `columns`.
    pub fn spawn(mut command: Command, rows: u16, columns: u16) -> OnATerminal {
        let (master, slave) = pty::open(Some(WindowSize { rows, columns })).unwrap();
        pty::attach(&mut command, slave.as_fd()).unwrap();
        let child = command.spawn().unwrap();
        // The test's copies of the slave are gone with these.
        drop((command, slave));
        let master = File::from(master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let (mut reader, written) = (master.try_clone().unwrap(), Arc::clone(&output));
        let reader = std::thread::spawn(move || {
            let mut buffer = [0; 4096];
            // EIO once the program and all it started have closed the slave.
            while let Ok(len @ 1..) = reader.read(&mut buffer) {
                written.lock().unwrap().extend_from_slice(&buffer[..len]);
            }
        });
        OnATerminal {
            master,
            child,
            output,
            reader,
        }
    }

    /// What the program has written so far.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the program has written `text` (at most five minutes).
    pub fn wait_for(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while !self.output().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Types `bytes` at the program.
    pub fn type_in(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Gives the terminal a new size, as a window's resize does.
    pub fn resize(&self, rows: u16, columns: u16) {
        pty::resize(self.master.as_fd(), WindowSize { rows, columns }).unwrap();
    }

    /// The program's exit status and all it wrote, once it has ended (at
    /// most five minutes).
    pub fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + Duration::from_secs(300);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                self.child.kill().unwrap();
                panic!("the program did not end: {}", self.output());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // All of the output: until the terminal's last user has closed it.
        while !self.reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        (status.code(), self.output())
    }
}
