//! A container's terminal (`ctr run -t`, a pod's tty). As containerd's runc
//! shim does with runc, the shim listens on a console socket;
//! provm-runtime's `create --console-socket` makes the
//! pseudo-terminal the container gets and sends its master there; the
//! shim then copies the client's input FIFO to the master and the master
//! to the client's output FIFO, and resizes the terminal as asked.

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use std::thread::JoinHandle;
use tempfile::TempDir;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The socket the runtime sends the terminal's master to, in a folder of
/// its own that goes with it.
pub struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
    _folder: TempDir,
}

impl ConsoleSocket {
    /// Listens in a new folder in the temporary folder, not in the bundle:
    /// containerd's bundle paths are longer than a socket's path may be
    /// (108 bytes), as runc's shim found too.
    pub fn bind() -> Result<ConsoleSocket, String> {
        let folder = tempfile::Builder::new()
            .prefix("provm-console")
            .tempdir()
            .map_err(|error| format!("cannot make the console socket's folder: {error}"))?;
        let path = folder.path().join("socket");
        let listener = UnixListener::bind(&path)
            .map_err(|error| format!("cannot listen at {}: {error}", path.display()))?;
        Ok(ConsoleSocket {
            listener,
            path,
            _folder: folder,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The master the runtime sent. Its `create` has returned by now, so
    /// its connection waits in the listener's queue with the descriptor.
    pub fn receive(self) -> Result<File, String> {
        let failed = |error: &dyn std::fmt::Display| {
            format!(
                "no terminal came on the console socket {}: {error}",
                self.path.display()
            )
        };
        let (stream, _) = self.listener.accept().map_err(|e| failed(&e))?;
        let mut name = [0u8; 64];
        match stream.recv_with_fd(&mut name).map_err(|e| failed(&e))? {
            (_, Some(master)) => Ok(master),
            (_, None) => Err(failed(&"the message held no descriptor")),
        }
    }
}

/// The terminal's master, copied to and from the client's streams.
pub struct Console {
    master: File,
}

impl Console {
    /// Copies `input` to `master` and `master` to `output`, each on a
    /// thread of its own. The returned thread ends when the terminal has
    /// no more output: once every holder of its slave, the container's
    /// process last, has closed it.
    pub fn attach(
        master: File,
        mut input: File,
        mut output: File,
    ) -> Result<(Console, JoinHandle<()>), String> {
        let cloned = |what: &str| {
            master
                .try_clone()
                .map_err(|error| format!("cannot copy the terminal's {what}: {error}"))
        };
        let mut to_master = cloned("input")?;
        let mut from_master = cloned("output")?;
        std::thread::spawn(move || {
            // Ends with the client's input; the command sees it end as a
            // terminal's does, when the client types its end-of-file.
            let _ = std::io::copy(&mut input, &mut to_master);
        });
        let output = std::thread::spawn(move || {
            // A master reads EIO once no slave is open: the end.
            if let Err(error) = std::io::copy(&mut from_master, &mut output) {
                if error.raw_os_error() != Some(libc::EIO) && error.kind() != ErrorKind::BrokenPipe
                {
                    containerd_shim::error!("the terminal's output: {error}");
                }
            }
        });
        Ok((Console { master }, output))
    }

    /// Sets the terminal's size, in characters.
    pub fn resize(&self, width: u32, height: u32) -> Result<(), String> {
        let size = libc::winsize {
            ws_row: u16::try_from(height).unwrap_or(u16::MAX),
            ws_col: u16::try_from(width).unwrap_or(u16::MAX),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize, which `size` is, from a
        // descriptor this console owns.
        if unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
            return Err(format!(
                "cannot resize the terminal: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}
