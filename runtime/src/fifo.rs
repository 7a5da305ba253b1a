//! The FIFO between `create` and `start`, as runc's exec.fifo: the
//! container's process opens it to write, which blocks until `start`
//! opens it to read; a byte passed, the command runs. While it exists the
//! container is "created".

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long `start` waits for the container's process to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub fn make(path: &Path) -> io::Result<()> {
    let name = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: mkfifo reads the NUL-terminated name, which outlives the call.
    match unsafe { libc::mkfifo(name.as_ptr(), 0o600) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The container's side: blocks until `start`.
pub fn wait_for_start(path: &Path) -> io::Result<()> {
    File::options().write(true).open(path)?.write_all(b"0")
}

/// `start`'s side: lets the container's process go on, unless it has
/// ended (`alive` says whether it lives); then removes the FIFO.
pub fn start(path: &Path, alive: impl Fn() -> bool) -> Result<(), String> {
    // Non-blocking: a process that ended would never open its end.
    let mut fifo = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let mut byte = [0u8];
    loop {
        match fifo.read(&mut byte) {
            Ok(1) => break,
            // No writer yet (0), or one that has not written (WouldBlock).
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
        }
        if !alive() {
            return Err("the container's process ended before it started: see the log".into());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the container's process did not answer in {} s",
                START_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::remove_file(path).map_err(|error| format!("cannot remove {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_lets_the_waiting_side_go_and_removes_the_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.fifo");
        make(&path).unwrap();
        let waiting = {
            let path = path.clone();
            std::thread::spawn(move || wait_for_start(&path))
        };
        start(&path, || true).unwrap();
        waiting.join().unwrap().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn start_fails_when_nobody_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.fifo");
        make(&path).unwrap();
        let error = start(&path, || false).unwrap_err();
        assert!(error.contains("ended before it started"), "{error}");
    }
}
