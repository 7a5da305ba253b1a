//! A job's data out: each output path, made an empty directory before the
//! command when the image lacks it, is walked after the command and sent
//! back as tree entries (names in byte order, so that the same tree is the
//! same messages).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use provm_guest_agent::tree::DATA_CHUNK;
use provm_guest_agent::{Entry, EntryContent, GuestMessage};

/// Makes every missing output directory, with its parents, so that the
/// command can write into it.
pub fn prepare(outputs: &[Vec<u8>]) -> Result<(), String> {
    for output in outputs {
        let path = Path::new(std::ffi::OsStr::from_bytes(output));
        if path.symlink_metadata().is_err() {
            fs::create_dir_all(path).map_err(|error| {
                format!(
                    "cannot make the output directory {}: {error}",
                    path.display()
                )
            })?;
        }
    }
    Ok(())
}

/// Sends every output tree to `emit`.
pub fn send(outputs: &[Vec<u8>], emit: &mut dyn FnMut(GuestMessage)) -> Result<(), String> {
    for (tree, output) in outputs.iter().enumerate() {
        let root = Path::new(std::ffi::OsStr::from_bytes(output));
        let mut sender = Sender {
            tree: tree as u32,
            emit: &mut *emit,
        };
        sender
            .walk(root, Vec::new())
            .map_err(|error| format!("cannot send the output {}: {error}", root.display()))?;
    }
    Ok(())
}

struct Sender<'a> {
    tree: u32,
    emit: &'a mut dyn FnMut(GuestMessage),
}

impl Sender<'_> {
    fn entry(&mut self, path: &[u8], content: EntryContent) {
        (self.emit)(GuestMessage::Entry(Entry {
            tree: self.tree,
            path: path.to_vec(),
            content,
        }));
    }

    /// Sends what is at `at`, named `path` in the tree; sockets, pipes and
    /// devices are left out (they have no content to copy).
    fn walk(&mut self, at: &Path, path: Vec<u8>) -> io::Result<()> {
        let metadata = match at.symlink_metadata() {
            Err(error) if error.kind() == io::ErrorKind::NotFound && path.is_empty() => {
                self.entry(&path, EntryContent::Missing);
                return Ok(());
            }
            other => other?,
        };
        let mode = metadata.permissions().mode() & 0o7777;
        let kind = metadata.file_type();
        if kind.is_symlink() {
            let target = fs::read_link(at)?;
            self.entry(
                &path,
                EntryContent::Symlink(target.as_os_str().as_bytes().to_vec()),
            );
        } else if kind.is_dir() {
            self.entry(&path, EntryContent::Dir { mode });
            let mut names: Vec<_> = fs::read_dir(at)?
                .map(|entry| entry.map(|entry| entry.file_name()))
                .collect::<io::Result<_>>()?;
            names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for name in names {
                let mut child = path.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(name.as_bytes());
                self.walk(&at.join(&name), child)?;
            }
        } else if kind.is_file() {
            self.entry(&path, EntryContent::File { mode });
            let mut file = File::open(at)?;
            let mut buffer = vec![0; DATA_CHUNK];
            loop {
                match file.read(&mut buffer)? {
                    0 => break,
                    len => self.entry(&path, EntryContent::Data(buffer[..len].to_vec())),
                }
            }
        }
        Ok(())
    }
}
