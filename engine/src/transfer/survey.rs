//! `--input`'s first room: each host path walked before the guest starts,
//! so that a bad one is refused before anything is written, into plain
//! data (its entries in the order they are sent, its files and bytes), and
//! the route all of them take: the agent channel, or from `DISK_FROM`
//! bytes the input disk. Nothing here reads a file's content: an input is
//! read once, on its route (`InputPlan::on_channel`, `input_disk::build`),
//! and only after the survey has found every input fit to go.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{guest_path, split_spec, DataError};

const MIB: u64 = 1 << 20;
/// From this many bytes the inputs go by disk. Below it the channel is
/// no slower where guest ring 0 runs natively (SVM, VMX: 1.5 MB/s, so
/// 64 KiB in 0.04 s), and it keeps the machine and its booted snapshot
/// those of a run without inputs; above it the channel's cost on PVM (11
/// KB/s: 64 KiB in 6 s) outweighs the disk's fixed one (docs/running.md).
pub const DISK_FROM: u64 = 64 << 10;

/// One `--input HOST_PATH:GUEST_PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub host: PathBuf,
    pub guest: String,
}

impl Input {
    /// Parses `HOST_PATH:GUEST_PATH` (split at the last ':', as a guest path
    /// seldom holds one).
    pub fn parse(spec: &str) -> Result<Input, DataError> {
        let (host, guest) =
            split_spec(spec, false).ok_or_else(|| DataError::InputSpec(spec.to_owned()))?;
        Ok(Input {
            host: PathBuf::from(host),
            guest: guest_path("--input", spec, guest)?,
        })
    }
}

/// What an input holds, in the order it is sent.
pub(super) enum Planned {
    Dir {
        path: Vec<u8>,
        mode: u32,
    },
    File {
        path: Vec<u8>,
        mode: u32,
        source: PathBuf,
        /// Its length when surveyed.
        len: u64,
    },
    Symlink {
        path: Vec<u8>,
        target: Vec<u8>,
    },
}

/// One input, surveyed.
pub(super) struct Surveyed {
    pub(super) input: Input,
    pub(super) entries: Vec<Planned>,
    pub(super) files: u64,
    /// Its files' lengths, as surveyed.
    pub(super) bytes: u64,
}

/// Every input surveyed, the command's standard input, and their route.
pub(super) struct Survey {
    pub(super) trees: Vec<Surveyed>,
    pub(super) stdin: Option<Vec<u8>>,
    /// The trees go on the input disk, not on the channel.
    pub(super) by_disk: bool,
}

impl Survey {
    /// Surveys `inputs`, sends them by disk if they hold `disk_from` bytes
    /// or more, and checks that what goes on the channel (they, if they
    /// do not go by disk, and `stdin`) fits the guest's `memory_mib`.
    pub(super) fn of(
        inputs: &[Input],
        stdin: Option<Vec<u8>>,
        memory_mib: u64,
        disk_from: u64,
    ) -> Result<Survey, DataError> {
        let trees = inputs.iter().map(surveyed).collect::<Result<Vec<_>, _>>()?;
        let tree_bytes = trees.iter().map(|tree| tree.bytes).sum::<u64>();
        let by_disk = tree_bytes >= disk_from;
        let bytes = if by_disk { 0 } else { tree_bytes }
            + stdin.as_ref().map_or(0, |stdin| stdin.len() as u64);
        // Each input is a tmpfs, and standard input a memory file: the guest
        // kernel lets a tmpfs grow to half its memory, and the command needs
        // the rest.
        if bytes > memory_mib * MIB / 2 {
            let bytes_mib = bytes.div_ceil(MIB);
            return Err(DataError::TooBigForMemory {
                bytes_mib,
                needed_mib: 2 * bytes_mib + memory_mib,
            });
        }
        Ok(Survey {
            trees,
            stdin,
            by_disk,
        })
    }
}

/// `input`'s entries, counted.
fn surveyed(input: &Input) -> Result<Surveyed, DataError> {
    let entries = entries(&input.host)?;
    let lens = entries.iter().filter_map(|entry| match entry {
        Planned::File { len, .. } => Some(*len),
        _ => None,
    });
    Ok(Surveyed {
        input: input.clone(),
        files: lens.clone().count() as u64,
        bytes: lens.sum(),
        entries,
    })
}

/// The entries of the file or folder at `host`, in the order they are sent
/// (a directory's names in byte order).
fn entries(host: &Path) -> Result<Vec<Planned>, DataError> {
    let unreadable = |path: &Path| {
        let path = path.to_owned();
        move |source: io::Error| DataError::InputUnreadable { path, source }
    };
    // The input itself is followed if it is a link: the user named it.
    let metadata = fs::metadata(host).map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => DataError::InputMissing(host.to_owned()),
        _ => unreadable(host)(error),
    })?;
    let mut entries = Vec::new();
    let mut pending = vec![(host.to_owned(), Vec::new(), metadata)];
    while let Some((at, path, metadata)) = pending.pop() {
        let mode = metadata.permissions().mode() & 0o7777;
        let kind = metadata.file_type();
        if kind.is_symlink() {
            let target = fs::read_link(&at).map_err(unreadable(&at))?;
            let target = target.as_os_str().as_bytes().to_vec();
            entries.push(Planned::Symlink { path, target });
        } else if kind.is_file() {
            entries.push(Planned::File {
                path,
                mode,
                source: at,
                len: metadata.len(),
            });
        } else if kind.is_dir() {
            let mut children = Vec::new();
            for child in fs::read_dir(&at).map_err(unreadable(&at))? {
                let child = child.map_err(unreadable(&at))?;
                let metadata = child.metadata().map_err(unreadable(&child.path()))?;
                children.push((child.file_name(), metadata));
            }
            // Popped in byte order: pushed in reverse.
            children.sort_by(|(a, _), (b, _)| b.as_bytes().cmp(a.as_bytes()));
            for (name, metadata) in children {
                let mut child = path.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(name.as_bytes());
                pending.push((at.join(&name), child, metadata));
            }
            entries.push(Planned::Dir { path, mode });
        } else {
            return Err(DataError::InputSpecial(at));
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_split_into_host_and_guest() {
        assert_eq!(
            Input::parse("data/in:/data/").unwrap(),
            Input {
                host: "data/in".into(),
                guest: "/data".into()
            }
        );
        assert!(matches!(Input::parse("data"), Err(DataError::InputSpec(_))));
        assert!(matches!(
            Input::parse(":/data"),
            Err(DataError::InputSpec(_))
        ));
        assert!(matches!(
            Input::parse("data:relative"),
            Err(DataError::GuestPath { .. })
        ));
        assert!(matches!(
            Input::parse("data:/proc/x"),
            Err(DataError::GuestPath { .. })
        ));
    }

    #[test]
    fn bad_inputs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Input {
            host: dir.path().join("nope"),
            guest: "/data".into(),
        };
        assert!(matches!(
            Survey::of(&[missing], None, 128, u64::MAX),
            Err(DataError::InputMissing(_))
        ));
        let big = dir.path().join("big");
        fs::write(&big, vec![0u8; 3 << 20]).unwrap();
        let big = Input {
            host: big,
            guest: "/big".into(),
        };
        assert!(matches!(
            Survey::of(std::slice::from_ref(&big), None, 4, u64::MAX),
            Err(DataError::TooBigForMemory {
                bytes_mib: 3,
                needed_mib: 10
            })
        ));
        // By disk, it takes no memory; standard input still does.
        let survey = Survey::of(std::slice::from_ref(&big), None, 4, 1 << 20).unwrap();
        assert!(survey.by_disk);
        assert!(matches!(
            Survey::of(&[big], Some(vec![0; 3 << 20]), 4, 1 << 20),
            Err(DataError::TooBigForMemory { bytes_mib: 3, .. })
        ));
    }
}
