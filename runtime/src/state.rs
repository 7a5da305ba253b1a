//! The containers' state under `--root`: a folder per container id with
//! what its process runs (`container.json`, written before it starts),
//! its process (`state.json`, written once it has) and the FIFO its
//! process waits on until `start` (`exec.fifo`), as runc keeps them.
//! Whether a container is created, running or stopped is read from its
//! process, which may have ended since anything was written.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bundle::Plan;

pub const CONTAINER_FILE: &str = "container.json";
pub const STATE_FILE: &str = "state.json";
pub const FIFO: &str = "exec.fifo";
/// The runtime-spec version of the state `state` prints.
const OCI_VERSION: &str = "1.0.2";

/// What a container's process runs: written by `create`, read by the
/// process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub plan: Plan,
    /// The disk made of the root directory.
    pub disk: PathBuf,
    /// The image as the trace names it: a name (from the annotations, else
    /// the container id) and a digest.
    pub image_name: String,
    pub image_digest: String,
    /// Whether `image_digest` is the image's (from an annotation) or the
    /// root directory's own.
    pub digest_of_root: bool,
    /// Where the recording goes; `None`: not recorded.
    pub trace: Option<PathBuf>,
}

/// The container's process, once started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub pid: i32,
    /// Its start time (/proc/PID/stat's 22nd field), so that another
    /// process given the same PID later is not taken for it.
    pub start_time: u64,
    pub created: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Stopped => "stopped",
        }
    }
}

/// The state `state` prints, runc's form of runtime-spec's.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    pub oci_version: &'static str,
    pub id: String,
    pub pid: i32,
    pub status: &'static str,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub created: String,
    pub owner: String,
    pub annotations: BTreeMap<String, String>,
}

/// The folder of every container.
pub struct Containers {
    root: PathBuf,
}

impl Containers {
    pub fn new(root: &Path) -> Containers {
        Containers {
            root: root.to_owned(),
        }
    }

    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Makes the folder of a new container `id`; refuses an id in use.
    pub fn claim(&self, id: &str) -> Result<PathBuf, String> {
        check_id(id)?;
        let cannot = |error: std::io::Error| {
            format!(
                "cannot make the state folder in {}: {error}; pass a writable --root",
                self.root.display()
            )
        };
        fs::create_dir_all(&self.root).map_err(cannot)?;
        let dir = self.dir(id);
        match fs::create_dir(&dir) {
            Ok(()) => Ok(dir),
            Err(error) if error.kind() == ErrorKind::AlreadyExists => Err(format!(
                "container {id} exists already: delete it first (provm-runtime delete {id}), or choose another id"
            )),
            Err(error) => Err(cannot(error)),
        }
    }

    pub fn container(&self, id: &str) -> Result<Container, String> {
        read_json(&self.known(id)?.join(CONTAINER_FILE))
    }

    /// The container's process; an error while `create` has not started it.
    pub fn process(&self, id: &str) -> Result<Process, String> {
        let path = self.known(id)?.join(STATE_FILE);
        if !path.exists() {
            return Err(format!("container {id} is still being created: try again"));
        }
        read_json(&path)
    }

    pub fn status(&self, id: &str, process: &Process) -> Status {
        if !alive(process) {
            Status::Stopped
        } else if self.dir(id).join(FIFO).exists() {
            Status::Created
        } else {
            Status::Running
        }
    }

    /// The state `state` shows.
    pub fn shown(&self, id: &str) -> Result<Shown, String> {
        let container = self.container(id)?;
        let process = self.process(id)?;
        let status = self.status(id, &process);
        Ok(Shown {
            oci_version: OCI_VERSION,
            id: id.to_owned(),
            pid: match status {
                Status::Stopped => 0,
                _ => process.pid,
            },
            status: status.name(),
            bundle: container.bundle,
            rootfs: container.plan.rootfs,
            created: process.created,
            owner: String::new(),
            annotations: container.plan.annotations,
        })
    }

    pub fn remove(&self, id: &str) -> Result<(), String> {
        fs::remove_dir_all(self.known(id)?)
            .map_err(|error| format!("cannot remove the state of container {id}: {error}"))
    }

    /// The folder of the container `id`, which must exist.
    fn known(&self, id: &str) -> Result<PathBuf, String> {
        check_id(id)?;
        let dir = self.dir(id);
        match dir.is_dir() {
            true => Ok(dir),
            false => Err(format!(
                "container {id} does not exist (in {}): check the id, and --root",
                self.root.display()
            )),
        }
    }
}

/// Writes `value` to `path` whole or not at all.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
    let partial = path.with_extension("partial");
    let text = serde_json::to_vec_pretty(value).expect("the state is plain data");
    fs::write(&partial, text)
        .and_then(|()| fs::rename(&partial, path))
        .map_err(|error| format!("cannot write {}: {error}", path.display()))
}

fn read_json<T: for<'a> Deserialize<'a>>(path: &Path) -> Result<T, String> {
    let text =
        fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    serde_json::from_slice(&text).map_err(|error| {
        format!(
            "{} is damaged ({error}): delete the container with --force",
            path.display()
        )
    })
}

/// runc's rule for ids: letters, digits and `_+-.`, not `.` or `..`: an
/// id names a folder.
fn check_id(id: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_+-.".contains(c);
    match !id.is_empty() && id != "." && id != ".." && id.chars().all(allowed) {
        true => Ok(()),
        false => Err(format!(
            "{id:?} is not a container id: use letters, digits and _+-. only"
        )),
    }
}

/// The start time of the process `pid`, if it lives (a zombie has ended).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: count from after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Field 3 is the state; field 22 the start time.
    match fields.first() {
        Some(&"Z") | Some(&"X") | None => None,
        _ => fields.get(22 - 3)?.parse().ok(),
    }
}

fn alive(process: &Process) -> bool {
    start_time(process.pid) == Some(process.start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_folder_names() {
        for good in ["abc", "f88863cd15b1", "host.user.12.0.3", "a_b+c-d"] {
            assert!(check_id(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "../x"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn this_process_lives_and_a_changed_start_time_does_not() {
        let pid = std::process::id() as i32;
        let start_time = start_time(pid).unwrap();
        let process = Process {
            pid,
            start_time,
            created: String::new(),
        };
        assert!(alive(&process));
        assert!(!alive(&Process {
            start_time: start_time + 1,
            ..process
        }));
    }

    #[test]
    fn an_id_is_claimed_once_and_an_unknown_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let containers = Containers::new(dir.path());
        containers.claim("one").unwrap();
        let again = containers.claim("one").unwrap_err();
        assert!(again.contains("exists already"), "{again}");
        let unknown = containers.container("two").unwrap_err();
        assert!(
            unknown.contains("container two does not exist"),
            "{unknown}"
        );
        let creating = containers.process("one").unwrap_err();
        assert!(creating.contains("being created"), "{creating}");
    }
}
