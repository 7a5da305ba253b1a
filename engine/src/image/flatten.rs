//! Layers applied in order into one tree, as a container runtime stacks
//! them: each layer's entries replace what lower layers have at their
//! paths, `.wh.NAME` deletes NAME from the layers below, and a directory
//! holding `.wh..wh..opq` hides everything the layers below put in it (the
//! OCI image specification's "whiteouts").
//!
//! Regular files, directories, symbolic links and hard links are created
//! in a staging directory, which `mkfs.ext4 -d` copies; what the staging
//! copy cannot hold without root (owners, modes, device nodes, extended
//! attributes) or cannot hold reproducibly (times) is kept in the tree and
//! applied to the file system afterwards (see `ext4`). Nothing is written
//! outside the staging directory: entries that climb out of the root, or
//! that lie under a symbolic link, are refused.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::ContainerError;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Directory,
    File,
    Symlink,
    CharDevice { major: u32, minor: u32 },
    BlockDevice { major: u32, minor: u32 },
    Fifo,
}

/// What the file system records of an entry besides its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: Kind,
    /// Permission bits, with setuid, setgid and sticky.
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    /// Seconds since 1970; also the entry's atime and ctime.
    pub mtime: u64,
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

impl Node {
    /// A directory the layers imply but do not list, as runtimes make it.
    fn implied_directory() -> Node {
        Node {
            kind: Kind::Directory,
            mode: 0o755,
            uid: 0,
            gid: 0,
            mtime: 0,
            xattrs: BTreeMap::new(),
        }
    }
}

/// The flattened image: every entry by path (relative, "" for the root),
/// sorted so that a directory comes before what it holds, and the staging
/// directory holding their contents.
pub struct Tree {
    staging: PathBuf,
    pub nodes: BTreeMap<PathBuf, Node>,
}

impl Tree {
    /// An empty root, staged in `staging` (an empty directory).
    pub fn new(staging: &Path) -> Tree {
        Tree {
            staging: staging.to_owned(),
            nodes: BTreeMap::from([(PathBuf::new(), Node::implied_directory())]),
        }
    }

    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// Applies the layer `number` (from 1), an uncompressed tar.
    pub fn apply(&mut self, number: usize, layer: impl Read) -> Result<(), ContainerError> {
        let error = |what: String| ContainerError::Layer {
            layer: number,
            what,
        };
        let io_error = |path: &Path| {
            let path = path.display().to_string();
            move |source: io::Error| error(format!("{path}: {source}"))
        };
        // A whiteout hides only what the layers below have (the entries
        // of its own layer stay, whatever their order in the tar).
        let mut added: HashSet<PathBuf> = HashSet::new();
        let mut archive = tar::Archive::new(layer);
        for entry in archive.entries().map_err(|e| error(e.to_string()))? {
            let mut entry = entry.map_err(|e| error(e.to_string()))?;
            let raw = entry.path_bytes().into_owned();
            let path = inside_root(&raw).ok_or_else(|| ContainerError::Escapes {
                layer: number,
                entry: String::from_utf8_lossy(&raw).into_owned(),
            })?;
            let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
            let parent = path.parent().unwrap_or(Path::new("")).to_owned();
            if name == OPAQUE.as_bytes() {
                self.parents(number, &path)?;
                let hidden: Vec<PathBuf> = self
                    .children(&parent)
                    .filter(|child| !added.contains(child))
                    .collect();
                for child in hidden {
                    self.remove(&child).map_err(io_error(&child))?;
                }
                continue;
            }
            if let Some(hidden) = name.strip_prefix(WHITEOUT.as_bytes()) {
                if matches!(hidden, b"" | b"." | b"..") {
                    return Err(error(format!("{} whites out no name", path.display())));
                }
                let hidden = parent.join(OsStr::from_bytes(hidden));
                if !added.contains(&hidden) {
                    self.remove(&hidden).map_err(io_error(&hidden))?;
                }
                continue;
            }
            self.parents(number, &path)?;
            let node =
                node_of(&mut entry).map_err(|e| error(format!("{}: {e}", path.display())))?;
            let staged = self.staging.join(&path);
            let kind = entry.header().entry_type();
            if path.as_os_str().is_empty() && !kind.is_dir() {
                return Err(error("its root is not a directory".into()));
            }
            if kind.is_dir() {
                if self.nodes.get(&path).map(|n| &n.kind) != Some(&Kind::Directory) {
                    self.remove(&path).map_err(io_error(&path))?;
                    fs::create_dir(&staged).map_err(io_error(&path))?;
                }
            } else if kind.is_hard_link() {
                let target = entry
                    .link_name_bytes()
                    .and_then(|target| inside_root(&target))
                    .ok_or_else(|| ContainerError::Escapes {
                        layer: number,
                        entry: String::from_utf8_lossy(&raw).into_owned(),
                    })?;
                // A hard link shares its target's inode: a regular file
                // here (mkfs -d links what it finds linked).
                let Some(target_node) = self
                    .nodes
                    .get(&target)
                    .filter(|n| n.kind == Kind::File)
                    .cloned()
                else {
                    return Err(error(format!(
                        "{} is a hard link to {}, which is not a regular file of the layers so far",
                        path.display(),
                        target.display()
                    )));
                };
                if target != path {
                    self.remove(&path).map_err(io_error(&path))?;
                    fs::hard_link(self.staging.join(&target), &staged).map_err(io_error(&path))?;
                }
                self.nodes.insert(path.clone(), target_node);
                added.insert(path);
                continue;
            } else {
                self.remove(&path).map_err(io_error(&path))?;
                match node.kind {
                    Kind::File => {
                        let mut file = fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(&staged)
                            .map_err(io_error(&path))?;
                        io::copy(&mut entry, &mut file).map_err(io_error(&path))?;
                    }
                    Kind::Symlink => {
                        let target = entry.link_name_bytes().unwrap_or_default();
                        std::os::unix::fs::symlink(OsStr::from_bytes(&target), &staged)
                            .map_err(io_error(&path))?;
                    }
                    // Made in the file system itself (see `ext4`).
                    _ => {}
                }
            }
            self.nodes.insert(path.clone(), node);
            added.insert(path);
        }
        Ok(())
    }

    /// Makes the directories `path` lies in, as a runtime does for a
    /// layer that lists a file but not its directory; refuses a path under
    /// anything but a directory (a symbolic link could lead out of the
    /// staging directory).
    fn parents(&mut self, number: usize, path: &Path) -> Result<(), ContainerError> {
        let mut current = PathBuf::new();
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        for component in parent.components() {
            current.push(component);
            match self.nodes.get(&current) {
                Some(node) if node.kind == Kind::Directory => {}
                Some(_) => {
                    return Err(ContainerError::Layer {
                        layer: number,
                        what: format!(
                            "{} lies under {}, which is not a directory",
                            path.display(),
                            current.display()
                        ),
                    })
                }
                None => {
                    fs::create_dir(self.staging.join(&current)).map_err(|source| {
                        ContainerError::Layer {
                            layer: number,
                            what: format!("{}: {source}", current.display()),
                        }
                    })?;
                    self.nodes
                        .insert(current.clone(), Node::implied_directory());
                }
            }
        }
        Ok(())
    }

    /// The paths directly in `dir`.
    fn children<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = PathBuf> + 'a {
        self.under(dir)
            .filter(move |path| path.parent() == Some(dir))
    }

    /// Every path below `dir` (not `dir` itself), in order.
    fn under<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = PathBuf> + 'a {
        self.nodes
            .range(dir.to_owned()..)
            .map(|(path, _)| path)
            .skip_while(move |path| path.as_path() == dir)
            .take_while(move |path| path.starts_with(dir))
            .cloned()
    }

    /// Removes `path` and all it holds, if it is there.
    fn remove(&mut self, path: &Path) -> io::Result<()> {
        let Some(node) = self.nodes.remove(path) else {
            return Ok(());
        };
        let staged = self.staging.join(path);
        match node.kind {
            Kind::Directory => {
                let below: Vec<PathBuf> = self.under(path).collect();
                for inside in below {
                    self.nodes.remove(&inside);
                }
                fs::remove_dir_all(staged)
            }
            Kind::File | Kind::Symlink => fs::remove_file(staged),
            _ => Ok(()),
        }
    }
}

/// A tar entry's path relative to the root, or `None` if it climbs out.
/// `./` and `/` prefixes are the root's, as tar writes them.
fn inside_root(raw: &[u8]) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            part => path.push(OsStr::from_bytes(part)),
        }
    }
    Some(path)
}

/// The entry's node, from its header and PAX records (which carry
/// extended attributes, and owners or times too large for the header).
fn node_of(entry: &mut tar::Entry<'_, impl Read>) -> io::Result<Node> {
    let header = entry.header();
    let device = || -> io::Result<(u32, u32)> {
        Ok((
            header.device_major()?.unwrap_or(0),
            header.device_minor()?.unwrap_or(0),
        ))
    };
    let kind = match header.entry_type() {
        tar::EntryType::Directory => Kind::Directory,
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::Link => Kind::File,
        tar::EntryType::Symlink => Kind::Symlink,
        tar::EntryType::Char => {
            let (major, minor) = device()?;
            Kind::CharDevice { major, minor }
        }
        tar::EntryType::Block => {
            let (major, minor) = device()?;
            Kind::BlockDevice { major, minor }
        }
        tar::EntryType::Fifo => Kind::Fifo,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an entry of a type provm does not know ({other:?})"),
            ))
        }
    };
    let mut node = Node {
        kind,
        mode: header.mode()? & 0o7777,
        uid: header.uid()?,
        gid: header.gid()?,
        mtime: header.mtime()?,
        xattrs: BTreeMap::new(),
    };
    if let Some(extensions) = entry.pax_extensions()? {
        for extension in extensions {
            let extension = extension?;
            let key = extension
                .key()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let number = || {
                let value = String::from_utf8_lossy(extension.value_bytes()).into_owned();
                // PAX times may have a fraction; ext4 gets whole seconds.
                value
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .parse::<u64>()
                    .ok()
            };
            match key {
                "uid" => node.uid = number().unwrap_or(node.uid),
                "gid" => node.gid = number().unwrap_or(node.gid),
                "mtime" => node.mtime = number().unwrap_or(node.mtime),
                _ => {
                    if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                        node.xattrs
                            .insert(name.to_owned(), extension.value_bytes().to_vec());
                    }
                }
            }
        }
    }
    Ok(node)
}
