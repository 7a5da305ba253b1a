//! File trees in transit between host and guest: the inputs the host sends
//! before a command and the outputs the agent sends back after it. A tree
//! travels as entries in walk order (a directory before what it holds), a
//! regular file as its `File` entry then its content in `Data` entries.

use crate::codec::{put_bytes, put_u32, DecodeError, Reader};

/// The most content bytes one `Data` entry carries: well inside a frame.
pub const DATA_CHUNK: usize = 256 * 1024;

/// One piece of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Which of the job's inputs or outputs (its index).
    pub tree: u32,
    /// Relative to the tree's root, '/'-separated; empty for the root itself.
    pub path: Vec<u8>,
    pub content: EntryContent,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryContent {
    /// A directory, with these permission bits.
    Dir { mode: u32 },
    /// A regular file, empty so far, with these permission bits.
    File { mode: u32 },
    /// More of the content of the file at `path`.
    Data(Vec<u8>),
    /// A symbolic link to this target (never followed).
    Symlink(Vec<u8>),
    /// Nothing is at the tree's root (an output the command removed).
    Missing,
}

mod tag {
    pub const DIR: u8 = 0;
    pub const FILE: u8 = 1;
    pub const DATA: u8 = 2;
    pub const SYMLINK: u8 = 3;
    pub const MISSING: u8 = 4;
}

impl Entry {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let tail = self.encode_head(out);
        out.extend_from_slice(tail);
    }

    /// Encodes all but a `Data` entry's bytes into `out`, and gives those
    /// bytes, which follow (empty for other entries).
    pub(crate) fn encode_head(&self, out: &mut Vec<u8>) -> &[u8] {
        put_u32(out, self.tree);
        put_bytes(out, &self.path);
        match &self.content {
            EntryContent::Dir { mode } => {
                out.push(tag::DIR);
                put_u32(out, *mode);
            }
            EntryContent::File { mode } => {
                out.push(tag::FILE);
                put_u32(out, *mode);
            }
            EntryContent::Data(bytes) => {
                out.push(tag::DATA);
                put_u32(out, bytes.len() as u32);
                return bytes;
            }
            EntryContent::Symlink(target) => {
                out.push(tag::SYMLINK);
                put_bytes(out, target);
            }
            EntryContent::Missing => out.push(tag::MISSING),
        }
        &[]
    }

    pub(crate) fn decode(reader: &mut Reader<'_>) -> Result<Entry, DecodeError> {
        let tree = reader.u32()?;
        let path = reader.bytes()?;
        let content = match reader.u8()? {
            tag::DIR => EntryContent::Dir {
                mode: reader.u32()?,
            },
            tag::FILE => EntryContent::File {
                mode: reader.u32()?,
            },
            tag::DATA => EntryContent::Data(reader.bytes()?),
            tag::SYMLINK => EntryContent::Symlink(reader.bytes()?),
            tag::MISSING => EntryContent::Missing,
            other => return Err(DecodeError::UnknownKind(other)),
        };
        Ok(Entry {
            tree,
            path,
            content,
        })
    }
}

/// Whether `path` stays inside the tree it is relative to: no absolute
/// path, no `..`, no empty or `.` component. The receiving side checks
/// every entry with it: a tree's sender must not write elsewhere.
pub fn stays_inside(path: &[u8]) -> bool {
    path.is_empty()
        || path
            .split(|&byte| byte == b'/')
            .all(|part| !matches!(part, b"" | b"." | b".."))
}

/// Why `path` cannot name an input or output in the guest, if it cannot:
/// it must be absolute, lexically normal and on the image's root file
/// system, not `/` itself nor under the kernel's file systems the agent
/// mounts over it.
pub fn guest_path_problem(path: &str) -> Option<String> {
    const KERNEL_FILE_SYSTEMS: [&str; 4] = ["/dev", "/proc", "/sys", "/run"];
    let Some(relative) = path.strip_prefix('/') else {
        return Some(format!(
            "{path:?} is not an absolute guest path: start it with /"
        ));
    };
    if relative.is_empty() {
        return Some(
            "the guest's root / itself cannot be an input or output: name a directory under it"
                .into(),
        );
    }
    if !stays_inside(relative.trim_end_matches('/').as_bytes()) {
        return Some(format!(
            "{path:?} is outside the guest's root or not normal: use an absolute path without `.`, `..` or `//`"
        ));
    }
    KERNEL_FILE_SYSTEMS
        .iter()
        .find(|system| path == **system || path.starts_with(&format!("{system}/")))
        .map(|system| {
            format!("{path:?} is under {system}, a kernel file system the guest mounts over the image: choose a path on the image's root file system")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_that_leave_their_tree_are_told_apart() {
        for inside in ["", "a", "a/b.csv", "..a/b..", "a/.hidden"] {
            assert!(stays_inside(inside.as_bytes()), "{inside}");
        }
        for outside in ["/etc/passwd", "..", "a/../../b", "a//b", "./a", "a/"] {
            assert!(!stays_inside(outside.as_bytes()), "{outside}");
        }
    }

    #[test]
    fn guest_paths_must_be_absolute_normal_and_on_the_root() {
        assert_eq!(guest_path_problem("/data"), None);
        assert_eq!(guest_path_problem("/srv/in/x.csv"), None);
        assert_eq!(guest_path_problem("/data/"), None);
        assert_eq!(guest_path_problem("/devices"), None);
        for bad in [
            "data",
            "/",
            "/data/../etc",
            "/a//b",
            "/proc/x",
            "/dev",
            "/sys/kernel",
        ] {
            assert!(guest_path_problem(bad).is_some(), "{bad}");
        }
    }
}
