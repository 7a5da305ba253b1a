//! The host's side of `--input` and standard input: each input surveyed
//! before the guest starts (so that a bad one is refused before anything is
//! written, and its digest goes in the trace's manifest), then sent as tree
//! entries, its content read again and checked against the survey; or, for
//! inputs of `DISK_FROM` bytes or more, put on the input disk
//! (`input_disk`) instead.

use std::fs::{self, File};
use std::io::{self, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use provm_guest_agent::tree::DATA_CHUNK;
use provm_guest_agent::{Entry, EntryContent, HostMessage};
use provm_trace::format::read_full;
use provm_trace::manifest::{DataDigest, InputRecord};
use sha2::{Digest, Sha256};

use super::{guest_path, split_spec, DataError};
use crate::digest::file_identity;
use crate::host_paths::HostPaths;

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

pub(super) struct Tree {
    input: Input,
    pub(super) entries: Vec<Planned>,
    pub(super) digest: DataDigest,
    files: u64,
}

/// Every input, surveyed, and the command's standard input: what follows
/// the job on the channel.
pub struct InputPlan {
    trees: Vec<Tree>,
    stdin: Option<Vec<u8>>,
    /// The trees go on the input disk, not on the channel.
    by_disk: bool,
}

impl InputPlan {
    /// Surveys `inputs` and checks that what goes on the channel (they,
    /// below `disk_from` bytes, and `stdin`) fits the guest's `memory_mib`.
    /// Inputs on the channel are read once here, for their digests; inputs
    /// that go by disk are digested as they are written to it
    /// (`digest_into`), so that they are read once in all.
    pub fn survey(
        inputs: &[Input],
        stdin: Option<Vec<u8>>,
        memory_mib: u64,
        disk_from: u64,
    ) -> Result<InputPlan, DataError> {
        let mut trees = Vec::new();
        for input in inputs {
            let entries = plan(&input.host)?;
            let files = entries
                .iter()
                .filter(|entry| matches!(entry, Planned::File { .. }))
                .count() as u64;
            let bytes = entries
                .iter()
                .map(|entry| match entry {
                    Planned::File { len, .. } => *len,
                    _ => 0,
                })
                .sum();
            trees.push(Tree {
                input: input.clone(),
                entries,
                digest: DataDigest {
                    sha256: String::new(),
                    bytes,
                },
                files,
            });
        }
        let tree_bytes = trees.iter().map(|tree| tree.digest.bytes).sum::<u64>();
        let by_disk = tree_bytes >= disk_from;
        if !by_disk {
            for tree in &mut trees {
                tree.digest = digest(TreeMessages::new(&tree.entries))?;
            }
        }
        let tree_bytes = trees.iter().map(|tree| tree.digest.bytes).sum::<u64>();
        let plan = InputPlan {
            trees,
            stdin,
            by_disk,
        };
        let bytes = if by_disk { 0 } else { tree_bytes }
            + plan.stdin.as_ref().map_or(0, |stdin| stdin.len() as u64);
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
        Ok(plan)
    }

    /// Whether the job sends nothing after itself.
    pub fn is_empty(&self) -> bool {
        (self.trees.is_empty() || self.by_disk) && self.stdin.is_none()
    }

    /// Whether the inputs go on the input disk.
    pub fn by_disk(&self) -> bool {
        self.by_disk
    }

    /// The surveyed trees.
    pub(super) fn trees(&self) -> &[Tree] {
        &self.trees
    }

    /// Reads every input (that goes by disk), handing each file's content
    /// to `write` (the input's index, the file's path in it, the bytes, in
    /// order), and digests it on the way, as the channel would send it:
    /// the digests are of what was handed over. A file that grew since its
    /// survey fails when `write` has no room for it (`WriteZero`).
    pub(super) fn digest_into(
        &mut self,
        mut write: impl FnMut(usize, &[u8], &[u8]) -> io::Result<()>,
    ) -> Result<(), DataError> {
        for (index, tree) in self.trees.iter_mut().enumerate() {
            let mut hasher = Sha256::new();
            let mut bytes = 0;
            for message in TreeMessages::new(&tree.entries) {
                let message = message?;
                digest_message(&mut hasher, &message);
                if let HostMessage::Entry(Entry {
                    path,
                    content: EntryContent::Data(data),
                    ..
                }) = &message
                {
                    bytes += data.len() as u64;
                    write(index, path, data).map_err(|error| {
                        if error.kind() == io::ErrorKind::WriteZero {
                            DataError::InputChanged(tree.input.host.clone())
                        } else {
                            DataError::InputDisk(error.to_string())
                        }
                    })?;
                }
            }
            tree.digest = DataDigest {
                sha256: provm_trace::hex(&hasher.finalize()),
                bytes,
            };
        }
        Ok(())
    }

    /// What identifies the inputs' current state without reading them:
    /// every entry's path, kind, mode or link target, and each file's
    /// identity (`digest::file_identity`, what the cache of image digests
    /// trusts). None if a file cannot be looked at.
    pub(super) fn identity(&self) -> Option<String> {
        let mut hasher = Sha256::new();
        hasher.update(b"provm input identity 1\n");
        for tree in &self.trees {
            hasher.update(b"tree\n");
            for entry in &tree.entries {
                let line = match entry {
                    Planned::Dir { path, mode } => {
                        [b"d ", &path[..], format!(" {mode}").as_bytes()].concat()
                    }
                    Planned::Symlink { path, target } => {
                        [b"l ", &path[..], b"\0", &target[..]].concat()
                    }
                    Planned::File {
                        path, mode, source, ..
                    } => {
                        let meta = fs::metadata(source).ok()?;
                        let fields = format!(" {mode} {}", file_identity(&meta));
                        [b"f ", &path[..], fields.as_bytes()].concat()
                    }
                };
                hasher.update((line.len() as u64).to_le_bytes());
                hasher.update(&line);
            }
        }
        Some(provm_trace::hex(&hasher.finalize()))
    }

    /// The trees' digests, in order.
    pub(super) fn digests(&self) -> Vec<DataDigest> {
        self.trees.iter().map(|tree| tree.digest.clone()).collect()
    }

    /// Sets the trees' digests (as `digests` gave them, for inputs whose
    /// identity is unchanged since).
    pub(super) fn set_digests(&mut self, digests: Vec<DataDigest>) {
        for (tree, digest) in self.trees.iter_mut().zip(digests) {
            tree.digest = digest;
        }
    }

    /// An input changed since its survey (a file of another length).
    pub(super) fn changed(&self, index: usize) -> DataError {
        DataError::InputChanged(self.trees[index].input.host.clone())
    }

    /// The job's input paths, in the guest.
    pub fn guest_paths(&self) -> Vec<Vec<u8>> {
        let guest = |tree: &Tree| tree.input.guest.clone().into_bytes();
        self.trees.iter().map(guest).collect()
    }

    pub fn has_stdin(&self) -> bool {
        self.stdin.is_some()
    }

    /// The inputs as the manifest records them.
    pub fn records(&self, host_paths: HostPaths) -> Vec<InputRecord> {
        let record = |tree: &Tree| InputRecord {
            host: host_paths.name(&tree.input.host),
            guest: tree.input.guest.clone(),
            sha256: tree.digest.sha256.clone(),
            files: tree.files,
            bytes: tree.digest.bytes,
        };
        self.trees.iter().map(record).collect()
    }

    /// The standard input's digest, if the command has one.
    pub fn stdin_digest(&self) -> Option<DataDigest> {
        self.stdin.as_ref().map(|stdin| DataDigest {
            sha256: crate::digest::bytes_sha256(stdin),
            bytes: stdin.len() as u64,
        })
    }

    /// The messages that follow the job: every input's entries (unless
    /// they go by disk), each input checked against its survey once sent,
    /// then standard input.
    pub fn messages(&self) -> impl Iterator<Item = Result<HostMessage, DataError>> + '_ {
        let on_channel = if self.by_disk { &[][..] } else { &self.trees };
        let trees = on_channel
            .iter()
            .enumerate()
            .flat_map(|(index, tree)| Checked {
                messages: TreeMessages::new(&tree.entries),
                index: index as u32,
                tree,
                hasher: Sha256::new(),
                ended: false,
            });
        let stdin = self.stdin.iter().flat_map(|stdin| {
            stdin
                .chunks(DATA_CHUNK)
                .map(|chunk| Ok(HostMessage::Stdin(chunk.to_vec())))
        });
        trees.chain(stdin)
    }
}

/// The entries of the file or folder at `host`, in the order they are sent
/// (a directory's names in byte order).
fn plan(host: &Path) -> Result<Vec<Planned>, DataError> {
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

/// Adds `message`, as encoded, to `hasher`, its data not copied to do so.
fn digest_message(hasher: &mut Sha256, message: &HostMessage) {
    let (head, data) = message.encoded_parts();
    hasher.update(head);
    hasher.update(data);
}

/// The SHA-256 of `messages` as encoded, and how many content bytes they
/// carry.
fn digest(
    messages: impl Iterator<Item = Result<HostMessage, DataError>>,
) -> Result<DataDigest, DataError> {
    let mut hasher = Sha256::new();
    let mut bytes = 0;
    for message in messages {
        let message = message?;
        bytes += content_len(&message);
        digest_message(&mut hasher, &message);
    }
    Ok(DataDigest {
        sha256: provm_trace::hex(&hasher.finalize()),
        bytes,
    })
}

fn content_len(message: &HostMessage) -> u64 {
    match message {
        HostMessage::Entry(Entry {
            content: EntryContent::Data(data),
            ..
        }) => data.len() as u64,
        _ => 0,
    }
}

/// Input files are read up to this much at a time, then cut into messages:
/// each read costs more than the copy under emulation (the SVM test bed
/// verified a trace in 34 s in reads of 64 KiB, 13 s in reads of 1 MiB).
const READ_SIZE: usize = 4 << 20;

/// One tree's messages, as tree 0 (`Checked` gives them their index), its
/// files read as they go.
struct TreeMessages<'a> {
    entries: std::slice::Iter<'a, Planned>,
    /// The file being sent, its entry path and its location.
    open: Option<(BufReader<File>, &'a [u8], &'a Path)>,
}

impl<'a> TreeMessages<'a> {
    fn new(entries: &'a [Planned]) -> Self {
        TreeMessages {
            entries: entries.iter(),
            open: None,
        }
    }

    fn entry(&self, path: &[u8], content: EntryContent) -> HostMessage {
        HostMessage::Entry(Entry {
            tree: 0,
            path: path.to_vec(),
            content,
        })
    }

    /// The next chunk of the open file, if any is left.
    fn next_chunk(&mut self) -> Option<Result<HostMessage, DataError>> {
        let (file, path, source) = self.open.as_mut()?;
        let mut chunk = vec![0; DATA_CHUNK];
        // Filled whole: chunks fall at the same places whatever sizes the
        // reads return.
        let read = read_full(file, &mut chunk).map_err(|source_error| DataError::InputUnreadable {
            path: source.to_path_buf(),
            source: source_error,
        });
        let path: &[u8] = path;
        match read {
            Ok(0) => {
                self.open = None;
                None
            }
            Ok(len) => {
                chunk.truncate(len);
                Some(Ok(self.entry(path, EntryContent::Data(chunk))))
            }
            Err(error) => {
                self.open = None;
                Some(Err(error))
            }
        }
    }
}

impl Iterator for TreeMessages<'_> {
    type Item = Result<HostMessage, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(chunk) = self.next_chunk() {
            return Some(chunk);
        }
        Some(Ok(match self.entries.next()? {
            Planned::Dir { path, mode } => self.entry(path, EntryContent::Dir { mode: *mode }),
            Planned::Symlink { path, target } => {
                self.entry(path, EntryContent::Symlink(target.clone()))
            }
            Planned::File {
                path,
                mode,
                source,
                len,
            } => {
                match File::open(source) {
                    Ok(file) => {
                        // No larger than the file: a folder of small files
                        // allocates no 4 MiB per file.
                        let capacity = (*len as usize).clamp(DATA_CHUNK, READ_SIZE);
                        let file = BufReader::with_capacity(capacity, file);
                        self.open = Some((file, path, source))
                    }
                    Err(error) => {
                        return Some(Err(DataError::InputUnreadable {
                            path: source.clone(),
                            source: error,
                        }))
                    }
                }
                self.entry(path, EntryContent::File { mode: *mode })
            }
        }))
    }
}

/// A tree's messages as sent, digested on the way (as tree 0, as the
/// survey digested them) and compared with the survey at the end: a file
/// that changed in between fails the run.
struct Checked<'a> {
    messages: TreeMessages<'a>,
    /// The tree's index among the job's inputs.
    index: u32,
    tree: &'a Tree,
    hasher: Sha256,
    ended: bool,
}

impl Iterator for Checked<'_> {
    type Item = Result<HostMessage, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        match self.messages.next() {
            Some(Ok(mut message)) => {
                digest_message(&mut self.hasher, &message);
                if let HostMessage::Entry(entry) = &mut message {
                    entry.tree = self.index;
                }
                Some(Ok(message))
            }
            Some(Err(error)) => {
                self.ended = true;
                Some(Err(error))
            }
            None => {
                self.ended = true;
                let sent = provm_trace::hex(&std::mem::take(&mut self.hasher).finalize());
                (sent != self.tree.digest.sha256)
                    .then(|| Err(DataError::InputChanged(self.tree.input.host.clone())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{JobData, OutputSink};
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

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        fs::write(dir.path().join("sub/b.csv"), "x,y\n1,2\n").unwrap();
        fs::write(dir.path().join("a.csv"), vec![7u8; DATA_CHUNK + 10]).unwrap();
        std::os::unix::fs::symlink("a.csv", dir.path().join("link")).unwrap();
        dir
    }

    fn sent(plan: &InputPlan) -> Vec<HostMessage> {
        plan.messages().collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn a_folder_is_sent_in_byte_order_with_its_content_chunked() {
        let dir = folder();
        let input = Input {
            host: dir.path().into(),
            guest: "/data".into(),
        };
        let plan = InputPlan::survey(&[input], Some(b"stdin".to_vec()), 128, u64::MAX).unwrap();
        let paths: Vec<(String, &str)> = sent(&plan)
            .iter()
            .map(|message| match message {
                HostMessage::Entry(entry) => (
                    String::from_utf8_lossy(&entry.path).into_owned(),
                    match entry.content {
                        EntryContent::Dir { .. } => "dir",
                        EntryContent::File { .. } => "file",
                        EntryContent::Data(_) => "data",
                        EntryContent::Symlink(_) => "link",
                        EntryContent::Missing => "missing",
                    },
                ),
                HostMessage::Stdin(_) => ("".into(), "stdin"),
                other => panic!("{other:?}"),
            })
            .collect();
        let expected = [
            ("", "dir"),
            ("a.csv", "file"),
            ("a.csv", "data"),
            ("a.csv", "data"),
            ("link", "link"),
            ("sub", "dir"),
            ("sub/b.csv", "file"),
            ("sub/b.csv", "data"),
            ("", "stdin"),
        ];
        let expected: Vec<(String, &str)> =
            expected.iter().map(|(p, k)| (p.to_string(), *k)).collect();
        assert_eq!(paths, expected);
        let record = &plan.records(HostPaths::default())[0];
        assert_eq!((record.files, record.bytes), (2, DATA_CHUNK as u64 + 18));
        assert_eq!(plan.stdin_digest().unwrap().bytes, 5);
    }

    #[test]
    fn each_input_is_sent_as_its_own_tree_with_the_digest_of_its_survey() {
        let (one, two) = (folder(), folder());
        let inputs = [one.path(), two.path()].map(|host| Input {
            host: host.into(),
            guest: "/data".into(),
        });
        let plan = InputPlan::survey(&inputs, None, 128, u64::MAX).unwrap();
        let trees: Vec<u32> = sent(&plan)
            .iter()
            .map(|message| match message {
                HostMessage::Entry(entry) => entry.tree,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(trees, [[0; 8], [1; 8]].concat());
        // The same content, wherever it is sent: the same digest.
        let records = plan.records(HostPaths::default());
        assert_eq!(records[0].sha256, records[1].sha256);
    }

    #[test]
    fn an_input_changed_after_its_survey_fails() {
        let dir = folder();
        let input = Input {
            host: dir.path().into(),
            guest: "/data".into(),
        };
        let plan = InputPlan::survey(&[input], None, 128, u64::MAX).unwrap();
        fs::write(dir.path().join("sub/b.csv"), "x,y\n1,3\n").unwrap();
        let result: Result<Vec<_>, _> = plan.messages().collect();
        assert!(matches!(result, Err(DataError::InputChanged(_))));
    }

    #[test]
    fn bad_inputs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Input {
            host: dir.path().join("nope"),
            guest: "/data".into(),
        };
        assert!(matches!(
            InputPlan::survey(&[missing], None, 128, u64::MAX),
            Err(DataError::InputMissing(_))
        ));
        let big = dir.path().join("big");
        fs::write(&big, vec![0u8; 3 << 20]).unwrap();
        let big = Input {
            host: big,
            guest: "/big".into(),
        };
        assert!(matches!(
            InputPlan::survey(std::slice::from_ref(&big), None, 4, u64::MAX),
            Err(DataError::TooBigForMemory {
                bytes_mib: 3,
                needed_mib: 10
            })
        ));
        // By disk, it takes no memory; standard input still does.
        let plan = InputPlan::survey(std::slice::from_ref(&big), None, 4, 1 << 20).unwrap();
        assert!(plan.by_disk());
        assert!(matches!(
            InputPlan::survey(&[big], Some(vec![0; 3 << 20]), 4, 1 << 20),
            Err(DataError::TooBigForMemory { bytes_mib: 3, .. })
        ));
    }

    #[test]
    fn inputs_from_the_threshold_on_go_by_disk_and_only_stdin_by_channel() {
        let dir = folder();
        let input = Input {
            host: dir.path().into(),
            guest: "/data".into(),
        };
        let bytes = DATA_CHUNK as u64 + 18;
        let below = InputPlan::survey(std::slice::from_ref(&input), None, 128, bytes + 1).unwrap();
        assert!(!below.by_disk() && !below.is_empty());
        let plan = InputPlan::survey(&[input], Some(b"in".to_vec()), 128, bytes).unwrap();
        assert!(plan.by_disk());
        assert!(matches!(sent(&plan)[..], [HostMessage::Stdin(_)]));
        let mut job = provm_guest_agent::Job::default();
        JobData {
            inputs: plan,
            input_disk: None,
            outputs: OutputSink::new(&[], false).unwrap(),
        }
        .describe(&mut job);
        assert!(job.input_disk && job.stdin);
        assert_eq!(job.inputs, [b"/data".to_vec()]);
    }
}
