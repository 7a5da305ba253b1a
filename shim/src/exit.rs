//! The container's process, waited for. provm-runtime's `create` starts
//! it and exits; the shim, the subreaper of what it starts, then becomes
//! its parent, and so the one that learns how it ended.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::{error, util::timestamp};

/// The status containerd expects of a process killed outright (128 + 9).
pub const KILLED: u32 = 128 + libc::SIGKILL as u32;

/// How the container's process ended.
#[derive(Clone)]
pub struct Exited {
    pub pid: u32,
    pub status: u32,
    pub at: Timestamp,
}

/// The container's process's end, once it has come.
#[derive(Default)]
pub struct Exit {
    exited: Mutex<Option<Exited>>,
    came: Condvar,
}

impl Exit {
    /// Waits for the process `pid`, a child of this one, on a thread of
    /// its own, and for the thread copying its terminal's `output` if it
    /// has one (so that the client has all of it when it learns of the
    /// end); `ended` is called with its end.
    pub fn watch(
        pid: i32,
        output: Option<JoinHandle<()>>,
        ended: impl FnOnce(&Exited) + Send + 'static,
    ) -> Arc<Exit> {
        let exit = Arc::new(Exit::default());
        let recorded = exit.clone();
        std::thread::spawn(move || {
            let status = status_of(pid);
            if let Some(output) = output {
                let _ = output.join();
            }
            let exited = Exited {
                pid: pid as u32,
                status,
                at: timestamp().unwrap_or_default(),
            };
            *recorded.exited.lock().unwrap() = Some(exited.clone());
            recorded.came.notify_all();
            ended(&exited);
        });
        exit
    }

    /// The end, if it has come.
    pub fn now(&self) -> Option<Exited> {
        self.exited.lock().unwrap().clone()
    }

    /// Blocks until the end comes.
    pub fn wait(&self) -> Exited {
        let exited = self.exited.lock().unwrap();
        let exited = self.came.wait_while(exited, |e| e.is_none()).unwrap();
        exited.clone().expect("waited for")
    }
}

/// The exit status of the child `pid`, as a shell gives it: its code, or
/// 128 + the signal that ended it.
fn status_of(pid: i32) -> u32 {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status into the integer it is given.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        if waited == pid {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            error!("cannot wait for the container's process {pid}: {error}");
            return 255;
        }
    }
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status) as u32
    } else {
        libc::WEXITSTATUS(status) as u32
    }
}
