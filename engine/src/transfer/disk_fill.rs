//! The input disk's making, from the survey: its file system laid out
//! with every file's blocks allocated but empty (`ext4::build_placed`),
//! then each input read once, as the channel would send it
//! (`tree_messages`), its files' bytes written at their extents and its
//! digest taken on the way. The disk holds what the digests are of, and
//! no input is read a second time for them.

use std::fs;
use std::io::{self, Seek, Write};
use std::iter;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use provm_guest_agent::{Entry, EntryContent, HostMessage};
use provm_trace::manifest::DataDigest;

use super::survey::{Planned, Surveyed};
use super::tree_messages::TreeMessages;
use super::DataError;
use crate::image::ext4::{self, Extent};
use crate::image::flatten::{Kind, Node, Tree};
use crate::image::ContainerError;

/// How much of the disk is written at a time.
pub(super) const WRITE_SIZE: usize = 4 << 20;

/// A disk made in a scratch directory, removed with it unless the disk
/// was moved out first.
pub(super) struct Made {
    pub(super) path: PathBuf,
    /// Its file, open for writing.
    pub(super) file: fs::File,
    /// The inputs' digests, in order.
    pub(super) digests: Vec<DataDigest>,
    _scratch: tempfile::TempDir,
}

/// Makes the disk of `trees` in a scratch directory in `dir`, and takes
/// the trees' digests as their files' bytes go in, so the disk holds what
/// the digests (the manifest's, the cache's key) are of.
pub(super) fn make(trees: &[Surveyed], dir: &Path) -> Result<Made, DataError> {
    let failed = DataError::input_disk_at(dir);
    fs::create_dir_all(dir).map_err(failed)?;
    let scratch = tempfile::Builder::new()
        .prefix(".making-")
        .tempdir_in(dir)
        .map_err(failed)?;
    let layout = lay_out(trees, scratch.path(), failed)?;
    let file = fs::OpenOptions::new()
        .write(true)
        .open(&layout.path)
        .map_err(failed)?;
    let digests = fill(trees, &file, &layout, failed)?;
    Ok(Made {
        path: layout.path,
        file,
        digests,
        _scratch: scratch,
    })
}

/// A built disk, its files' blocks allocated but not written.
struct Layout {
    path: PathBuf,
    /// Each file's path in the disk and its length, in the order of the
    /// trees' entries.
    placed: Vec<(PathBuf, u64)>,
    /// Each file's extents, in that order.
    extents: Vec<Vec<Extent>>,
}

/// Builds the disk of `trees` in `scratch`, its files empty.
fn lay_out(
    trees: &[Surveyed],
    scratch: &Path,
    failed: impl Fn(io::Error) -> DataError + Copy,
) -> Result<Layout, DataError> {
    let staging = scratch.join("root");
    fs::create_dir(&staging).map_err(failed)?;
    let mut tree = Tree::new(&staging);
    let mut placed = Vec::new();
    for (number, input) in trees.iter().enumerate() {
        let at = Path::new(&number.to_string()).to_owned();
        stage(&mut tree, &at, &input.entries, &mut placed).map_err(failed)?;
    }
    let path = scratch.join("inputs.ext4");
    let extents = ext4::build_placed(&tree, scratch, &path, &placed).map_err(|error| {
        DataError::InputDisk(match error {
            ContainerError::Unsupported(name) => format!("{name}: rename it"),
            other => other.to_string(),
        })
    })?;
    Ok(Layout {
        path,
        placed,
        extents,
    })
}

/// Puts one input's `entries` in the staging directory under `at`, and
/// their metadata in `tree`: files empty, each added to `placed` with its
/// length (their bytes are written into the built disk).
fn stage(
    tree: &mut Tree,
    at: &Path,
    entries: &[Planned],
    placed: &mut Vec<(PathBuf, u64)>,
) -> io::Result<()> {
    let staged = |path: &[u8]| match path {
        [] => at.to_owned(),
        path => at.join(std::ffi::OsStr::from_bytes(path)),
    };
    for entry in entries {
        let (path, kind, mode) = match entry {
            Planned::Dir { path, mode } => {
                fs::create_dir(tree.staging().join(staged(path)))?;
                (path, Kind::Directory, *mode)
            }
            Planned::File {
                path, mode, len, ..
            } => {
                fs::File::create(tree.staging().join(staged(path)))?;
                placed.push((staged(path), *len));
                (path, Kind::File, *mode)
            }
            Planned::Symlink { path, target } => {
                symlink(
                    std::ffi::OsStr::from_bytes(target),
                    tree.staging().join(staged(path)),
                )?;
                (path, Kind::Symlink, 0o777)
            }
        };
        let node = Node {
            kind,
            mode,
            uid: 0,
            gid: 0,
            mtime: ext4::FIXED_TIME,
            xattrs: Default::default(),
        };
        tree.nodes.insert(staged(path), node);
    }
    Ok(())
}

/// Reads `trees` into the files of `layout`, its disk open as `file`, and
/// returns their digests. A file that shrank or grew since its survey
/// fails the build.
fn fill(
    trees: &[Surveyed],
    file: &fs::File,
    layout: &Layout,
    failed: impl Fn(io::Error) -> DataError + Copy,
) -> Result<Vec<DataDigest>, DataError> {
    let mut filler = Filler {
        out: io::BufWriter::with_capacity(WRITE_SIZE, file),
        next_at: None,
        layout,
        written: vec![0; layout.placed.len()],
        begun: 0,
    };
    let mut digests = Vec::new();
    for tree in trees {
        let mut messages = TreeMessages::new(&tree.entries);
        for message in &mut messages {
            filler.take(&message?).map_err(|error| {
                if error.kind() == io::ErrorKind::WriteZero {
                    DataError::InputChanged(tree.input.host.clone())
                } else {
                    DataError::InputDisk(error.to_string())
                }
            })?;
        }
        digests.push(messages.digest());
    }
    let written = filler.finish().map_err(failed)?;
    // A file that shrank since its survey.
    let owners = trees
        .iter()
        .flat_map(|tree| iter::repeat_n(&tree.input.host, tree.files as usize));
    for (((_, len), written), host) in layout.placed.iter().zip(&written).zip(owners) {
        if len != written {
            return Err(DataError::InputChanged(host.clone()));
        }
    }
    Ok(digests)
}

/// Fills the placed files of a built disk, empty in it, from their
/// messages: a file's `File` entry, then its data, written at its extents.
struct Filler<'a> {
    /// Writes that follow one another go out as one: under emulation each
    /// write costs more than its copy.
    out: io::BufWriter<&'a fs::File>,
    /// Where the last write ended.
    next_at: Option<u64>,
    layout: &'a Layout,
    /// How many bytes of each placed file were written.
    written: Vec<u64>,
    /// How many files' entries came: the last is the one being filled.
    begun: usize,
}

impl Filler<'_> {
    /// Writes `message`'s content, if it has any. A file that grew since
    /// its survey fails when its extents have no room left (`WriteZero`).
    fn take(&mut self, message: &HostMessage) -> io::Result<()> {
        let HostMessage::Entry(Entry { content, .. }) = message else {
            return Ok(());
        };
        match content {
            EntryContent::File { .. } => self.begun += 1,
            EntryContent::Data(data) => self.append(self.begun - 1, data)?,
            _ => {}
        }
        Ok(())
    }

    /// Writes `data` after what file number `file` holds.
    fn append(&mut self, file: usize, mut data: &[u8]) -> io::Result<()> {
        let extents = &self.layout.extents[file];
        while !data.is_empty() {
            let (at, room) = extents
                .iter()
                .find_map(|extent| extent.locate(self.written[file]))
                .ok_or(io::ErrorKind::WriteZero)?;
            let len = data.len().min(room as usize);
            self.write_at(&data[..len], at)?;
            data = &data[len..];
            self.written[file] += len as u64;
        }
        // The rest of the file's last block: zeros, whatever the disk held.
        let len = self.layout.placed[file].1;
        if self.written[file] == len {
            let tail = len.next_multiple_of(ext4::BLOCK) - len;
            if let Some((at, _)) = extents.iter().find_map(|e| e.locate(len)) {
                self.write_at(&vec![0; tail as usize], at)?;
            }
        }
        Ok(())
    }

    fn write_at(&mut self, bytes: &[u8], at: u64) -> io::Result<()> {
        if self.next_at != Some(at) {
            self.out.seek(io::SeekFrom::Start(at))?;
        }
        self.out.write_all(bytes)?;
        self.next_at = Some(at + bytes.len() as u64);
        Ok(())
    }

    /// Flushes the writes, and says how many bytes each file got.
    fn finish(self) -> io::Result<Vec<u64>> {
        self.out.into_inner().map_err(|error| error.into_error())?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::transfer::survey::{Input, Survey};
    use crate::transfer::tree_messages;

    /// Two inputs: a folder with a file of several chunks and blocks, an
    /// empty file and a link; and a file of its own.
    fn inputs(at: &Path) -> Vec<Input> {
        let folder = at.join("folder");
        fs::create_dir_all(folder.join("sub")).unwrap();
        let big: Vec<u8> = (0..3 * ext4::BLOCK + 5).map(|i| (i % 251) as u8).collect();
        fs::write(folder.join("sub/big"), big).unwrap();
        fs::write(folder.join("empty"), b"").unwrap();
        symlink("sub/big", folder.join("link")).unwrap();
        fs::write(at.join("alone"), b"one file\n").unwrap();
        [("folder", "/data"), ("alone", "/alone")]
            .map(|(host, guest)| Input {
                host: at.join(host),
                guest: guest.into(),
            })
            .to_vec()
    }

    #[test]
    fn the_disk_holds_the_inputs_and_their_digests_are_the_channels() {
        let (host, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let survey = Survey::of(&inputs(host.path()), None, 128, 0).unwrap();
        let made = make(&survey.trees, cache.path()).unwrap();
        let on_channel: Vec<DataDigest> = survey
            .trees
            .iter()
            .map(|tree| tree_messages::digest(&tree.entries).unwrap())
            .collect();
        assert_eq!(made.digests, on_channel);
        drop(made.file);
        for (on_disk, on_host) in [("0/sub/big", "folder/sub/big"), ("1", "alone")] {
            let out = cache.path().join("out");
            let dumped = Command::new("debugfs")
                .arg("-R")
                .arg(format!("dump /{on_disk} {}", out.display()))
                .arg(&made.path)
                .output()
                .unwrap();
            assert!(dumped.status.success(), "{dumped:?}");
            let expected = fs::read(host.path().join(on_host)).unwrap();
            assert_eq!(fs::read(&out).unwrap(), expected, "{on_disk}");
        }
    }

    #[test]
    fn a_file_that_changed_length_since_its_survey_fails_the_making() {
        for len in [3 * ext4::BLOCK, 4 * ext4::BLOCK + 1] {
            let (host, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let survey = Survey::of(&inputs(host.path()), None, 128, 0).unwrap();
            fs::write(host.path().join("folder/sub/big"), vec![1; len as usize]).unwrap();
            let Err(refused) = make(&survey.trees, cache.path()) else {
                panic!("a file of {len} bytes, surveyed at another length, is refused");
            };
            assert!(
                matches!(&refused, DataError::InputChanged(path) if path.ends_with("folder")),
                "{refused}"
            );
        }
    }
}
