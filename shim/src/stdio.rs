//! The container's standard streams: containerd names a FIFO for each in
//! the create request (none for a stream it does not take), whose other
//! end its client holds, or for output a file (`file://PATH`, `ctr run
//! --log-uri`); provm-runtime's process takes them as its own, or, for a
//! container with a terminal, the shim copies them to and from it
//! (`console`).

use std::fs::{File, OpenOptions};

/// The three streams, opened.
pub struct Streams {
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
}

impl Streams {
    /// None at all (the null device), for a process whose streams are a
    /// terminal's.
    pub fn none() -> Result<Streams, String> {
        open("", "", "")
    }
}

/// Opens the FIFOs at `stdin`, `stdout` and `stderr` (an empty path: the
/// null device).
pub fn open(stdin: &str, stdout: &str, stderr: &str) -> Result<Streams, String> {
    Ok(Streams {
        // Blocks until a writer opens it, as containerd's client does
        // before it asks for the task: opened without waiting, the FIFO
        // would read as empty before the client came.
        stdin: opened(stdin, OpenOptions::new().read(true))?,
        // Read and write, which does not wait for the client's reader (on
        // Linux); the container's process then holds the writing end, and
        // the client sees the stream end when that process has ended.
        stdout: output(stdout)?,
        stderr: output(stderr)?,
    })
}

fn output(path: &str) -> Result<File, String> {
    if let Some(file) = path.strip_prefix("file://") {
        return opened(file, OpenOptions::new().append(true).create(true));
    }
    if path.contains("://") {
        return Err(format!(
            "the container's output goes to {path}, and the shim takes FIFOs and file:// only"
        ));
    }
    opened(path, OpenOptions::new().read(true).write(true))
}

fn opened(path: &str, options: &OpenOptions) -> Result<File, String> {
    let path = match path {
        "" => "/dev/null",
        path => path,
    };
    options
        .open(path)
        .map_err(|error| format!("cannot open the container's stream {path}: {error}"))
}
