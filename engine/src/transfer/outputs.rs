//! The host's side of `--output`: what the guest sends back is written
//! under a temporary name beside each host path and renamed into place
//! only once the command has ended, so a host path holds either nothing
//! new or the whole output. An existing host path is refused before the
//! run, and again at the rename, unless `force`.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use provm_guest_agent::tree::stays_inside;
use provm_guest_agent::{Entry, EntryContent};

use super::{guest_path, split_spec, DataError};

/// One `--output GUEST_PATH:HOST_PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub guest: String,
    pub host: PathBuf,
}

impl Output {
    /// Parses `GUEST_PATH:HOST_PATH` (split at the first ':').
    pub fn parse(spec: &str) -> Result<Output, DataError> {
        let (guest, host) =
            split_spec(spec, true).ok_or_else(|| DataError::OutputSpec(spec.to_owned()))?;
        Ok(Output {
            guest: guest_path("--output", spec, guest)?,
            host: PathBuf::from(host),
        })
    }
}

/// Refuses outputs that exist (unless `force`) or share a host path.
pub fn check(outputs: &[Output], force: bool) -> Result<(), DataError> {
    for (index, output) in outputs.iter().enumerate() {
        if outputs[..index]
            .iter()
            .any(|other| other.host == output.host)
        {
            return Err(DataError::OutputTwice(output.host.clone()));
        }
        if !force && output.host.symlink_metadata().is_ok() {
            return Err(DataError::OutputExists(output.host.clone()));
        }
    }
    Ok(())
}

/// What came back of one output.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    /// Nothing was at the guest path when the command ended.
    pub missing: bool,
    pub files: u64,
    pub bytes: u64,
}

/// Receives the outputs' entries as the guest sends them.
pub struct OutputSink {
    staged: Vec<Staged>,
    force: bool,
}

struct Staged {
    output: Output,
    /// Beside the host path, removed when dropped.
    temp: tempfile::TempDir,
    /// The regular file `Data` entries go to, and its staged path.
    open: Option<(PathBuf, File)>,
    delivered: Delivered,
    received: bool,
}

impl Staged {
    /// Where the entry at `path` of this output is staged.
    fn path(&self, path: &[u8]) -> PathBuf {
        let root = self.temp.path().join("root");
        if path.is_empty() {
            root
        } else {
            root.join(std::ffi::OsStr::from_bytes(path))
        }
    }
}

impl OutputSink {
    /// Stages every output beside its host path, after `check`ing them.
    pub fn new(outputs: &[Output], force: bool) -> Result<OutputSink, DataError> {
        check(outputs, force)?;
        let staged = outputs
            .iter()
            .map(|output| {
                let dir = match output.host.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir,
                    _ => Path::new("."),
                };
                let name = output
                    .host
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy();
                let temp = tempfile::Builder::new()
                    .prefix(&format!(".{name}."))
                    .suffix(".partial")
                    .tempdir_in(dir)
                    .map_err(|source| DataError::OutputWrite {
                        path: output.host.clone(),
                        source,
                    })?;
                Ok(Staged {
                    output: output.clone(),
                    temp,
                    open: None,
                    delivered: Delivered::default(),
                    received: false,
                })
            })
            .collect::<Result<_, DataError>>()?;
        Ok(OutputSink { staged, force })
    }

    /// The outputs' guest paths, for the job.
    pub fn guest_paths(&self) -> Vec<Vec<u8>> {
        let guest = |staged: &Staged| staged.output.guest.clone().into_bytes();
        self.staged.iter().map(guest).collect()
    }

    /// Stores one entry the guest sent. Entries must stay inside their
    /// output: the guest does not choose where on the host it writes.
    pub fn take(&mut self, entry: Entry) -> Result<(), DataError> {
        let outside = || {
            let path = String::from_utf8_lossy(&entry.path);
            DataError::OutputOutside(format!("{}:{path}", entry.tree))
        };
        let staged = self
            .staged
            .get_mut(entry.tree as usize)
            .ok_or_else(outside)?;
        if !stays_inside(&entry.path) {
            return Err(outside());
        }
        staged.received = true;
        let path = staged.path(&entry.path);
        let failed = |source| DataError::OutputWrite {
            path: staged.output.host.clone(),
            source,
        };
        match entry.content {
            EntryContent::Dir { mode } => {
                fs::create_dir(&path).map_err(failed)?;
                // Kept writable by its owner, so that it can be filled.
                fs::set_permissions(&path, fs::Permissions::from_mode(mode | 0o700))
                    .map_err(failed)?;
            }
            EntryContent::File { mode } => {
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode & 0o777)
                    .open(&path)
                    .map_err(failed)?;
                staged.delivered.files += 1;
                staged.open = Some((path, file));
            }
            EntryContent::Data(bytes) => match &mut staged.open {
                Some((open, file)) if *open == path => {
                    file.write_all(&bytes).map_err(failed)?;
                    staged.delivered.bytes += bytes.len() as u64;
                }
                _ => return Err(outside()),
            },
            EntryContent::Symlink(target) => {
                symlink(std::ffi::OsStr::from_bytes(&target), &path).map_err(failed)?
            }
            EntryContent::Missing => staged.delivered.missing = true,
        }
        Ok(())
    }

    /// Renames every output into place (replacing what is there only with
    /// `force`) and says what each held.
    pub fn commit(self) -> Result<Vec<(Output, Delivered)>, DataError> {
        let mut delivered = Vec::new();
        for mut staged in self.staged {
            staged.open = None;
            let host = staged.output.host.clone();
            let failed = |source| DataError::OutputWrite {
                path: host.clone(),
                source,
            };
            // A guest that sent nothing for an output ran an older agent.
            staged.delivered.missing |= !staged.received;
            if !staged.delivered.missing {
                if host.symlink_metadata().is_ok() {
                    if !self.force {
                        return Err(DataError::OutputExists(host));
                    }
                    remove(&host).map_err(failed)?;
                }
                fs::rename(staged.path(b""), &host).map_err(failed)?;
            }
            delivered.push((staged.output, staged.delivered));
        }
        Ok(delivered)
    }
}

fn remove(path: &Path) -> std::io::Result<()> {
    if path.symlink_metadata()?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink for one output, to `results` in a new directory.
    fn sink() -> (tempfile::TempDir, PathBuf, OutputSink) {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("results");
        let outputs = [Output {
            guest: "/out".into(),
            host: host.clone(),
        }];
        let sink = OutputSink::new(&outputs, false).unwrap();
        (dir, host, sink)
    }

    fn entry(tree: u32, path: &str, content: EntryContent) -> Entry {
        Entry {
            tree,
            path: path.as_bytes().to_vec(),
            content,
        }
    }

    #[test]
    fn specs_split_into_guest_and_host() {
        assert_eq!(
            Output::parse("/out:results").unwrap(),
            Output {
                guest: "/out".into(),
                host: "results".into()
            }
        );
        assert!(matches!(
            Output::parse("/out"),
            Err(DataError::OutputSpec(_))
        ));
        assert!(matches!(
            Output::parse("out:results"),
            Err(DataError::GuestPath { .. })
        ));
    }

    #[test]
    fn outputs_appear_whole_at_commit_and_never_replace_without_force() {
        let (dir, host, mut sink) = sink();
        sink.take(entry(0, "", EntryContent::Dir { mode: 0o755 }))
            .unwrap();
        sink.take(entry(0, "r.csv", EntryContent::File { mode: 0o644 }))
            .unwrap();
        sink.take(entry(0, "r.csv", EntryContent::Data(b"a,1\n".to_vec())))
            .unwrap();
        assert!(!host.exists(), "nothing in place before the commit");
        let delivered = sink.commit().unwrap();
        assert_eq!(
            delivered[0].1,
            Delivered {
                missing: false,
                files: 1,
                bytes: 4
            }
        );
        assert_eq!(fs::read(host.join("r.csv")).unwrap(), b"a,1\n");
        let outputs = [Output {
            guest: "/out".into(),
            host,
        }];
        assert!(matches!(
            OutputSink::new(&outputs, false),
            Err(DataError::OutputExists(_))
        ));
        // Only the output is left in the folder: no staging directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn entries_that_leave_their_output_are_refused() {
        let (dir, _, mut sink) = sink();
        sink.take(entry(0, "", EntryContent::Dir { mode: 0o755 }))
            .unwrap();
        for bad in [
            entry(0, "../escape", EntryContent::File { mode: 0o644 }),
            entry(0, "/etc/passwd", EntryContent::File { mode: 0o644 }),
            entry(1, "x", EntryContent::File { mode: 0o644 }),
            entry(0, "never-opened", EntryContent::Data(b"x".to_vec())),
        ] {
            assert!(
                matches!(sink.take(bad.clone()), Err(DataError::OutputOutside(_))),
                "{bad:?}"
            );
        }
        assert!(!dir.path().join("escape").exists());
    }

    #[test]
    fn a_missing_output_puts_nothing_in_place() {
        let (_dir, host, mut sink) = sink();
        sink.take(entry(0, "", EntryContent::Missing)).unwrap();
        assert!(sink.commit().unwrap()[0].1.missing);
        assert!(!host.exists());
    }
}
