//! What a container wrote to its root, written back to the bundle's root
//! directory when it exits, as a runc container writes there directly:
//! `podman diff` and `podman commit` see it. The run keeps its overlay for
//! this (`RunOptions::keep_overlay`); the root file system after the run
//! is compared with the disk the run started from, both read without
//! mounting, and what differs is applied to the directory: entries added
//! or changed (type, permissions, owner, size or modification time) are
//! written, entries gone are removed. Paths where the run's inputs went
//! (read-only volumes) are left alone: they are not the root's.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use ext4_view::{Ext4, Metadata};

/// What the write-back did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub written: usize,
    pub removed: usize,
    /// Devices, FIFOs and sockets the container made: a directory of
    /// files takes none of them back (nor would `podman commit`'s layer).
    pub skipped: Vec<String>,
}

/// Applies to `rootfs` what differs between `before` and `after`, except
/// at and under the guest paths `untouched`.
pub fn write_back(
    before: &Ext4,
    after: &Ext4,
    rootfs: &Path,
    untouched: &[String],
) -> Result<Changes, String> {
    let mut back = WriteBack {
        before,
        after,
        rootfs,
        untouched,
        changes: Changes::default(),
    };
    back.directory("/").map_err(|error| {
        format!(
            "cannot write the container's changes back to {}: {error}",
            rootfs.display()
        )
    })?;
    Ok(back.changes)
}

struct WriteBack<'a> {
    before: &'a Ext4,
    after: &'a Ext4,
    rootfs: &'a Path,
    untouched: &'a [String],
    changes: Changes,
}

impl WriteBack<'_> {
    /// The directory `dir` (a guest path, present after the run), whose
    /// own metadata is already applied.
    fn directory(&mut self, dir: &str) -> io::Result<()> {
        let entries_after = entries(self.after, dir)?;
        // Nothing, where the directory is new.
        let mut entries_before = entries(self.before, dir).unwrap_or_default();
        for (name, after) in &entries_after {
            let path = child(dir, name);
            let before = entries_before.remove(name);
            if !self.is_untouched(&path) {
                self.entry(&path, before.as_ref(), after)?;
            }
        }
        // What was there before and is gone.
        for name in entries_before.keys() {
            let path = child(dir, name);
            if !self.is_untouched(&path) {
                remove(&self.host(&path))?;
                self.changes.removed += 1;
            }
        }
        Ok(())
    }

    /// The entry at `path`, `after` the run and `before` it (if it was
    /// there): written if it differs, and a directory gone through either
    /// way (what it holds may differ although it does not).
    fn entry(&mut self, path: &str, before: Option<&Metadata>, after: &Metadata) -> io::Result<()> {
        let same = before.is_some_and(|before| unchanged(before, after));
        let host = self.host(path);
        let kind = after.file_type();
        if kind.is_dir() {
            if !same {
                if before.is_some_and(|before| !before.is_dir()) || !host.is_dir() {
                    remove(&host)?;
                    fs::create_dir(&host)?;
                }
                own(&host, after)?;
                self.changes.written += 1;
            }
            return self.directory(path);
        }
        if same {
            return Ok(());
        }
        if kind.is_regular_file() {
            let content = self.after.read(path).map_err(io::Error::other)?;
            replace_file(&host, &content, after)?;
        } else if kind.is_symlink() {
            let target = self.after.read_link(path).map_err(io::Error::other)?;
            remove(&host)?;
            symlink(OsStr::from_bytes(target.as_ref()), &host)?;
            lchown(&host, Some(after.uid()), Some(after.gid()))?;
        } else {
            self.changes.skipped.push(path.to_owned());
            return Ok(());
        }
        self.changes.written += 1;
        Ok(())
    }

    /// Where the guest path `path` is in the bundle's root.
    fn host(&self, path: &str) -> PathBuf {
        self.rootfs.join(path.trim_start_matches('/'))
    }

    fn is_untouched(&self, path: &str) -> bool {
        self.untouched.iter().any(|input| {
            let input = input.trim_end_matches('/');
            path == input
                || path
                    .strip_prefix(input)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }
}

/// The same entry as far as a write back goes: a file's bytes change its
/// size or its modification time (the access time, which reading
/// changes, is not compared).
fn unchanged(before: &Metadata, after: &Metadata) -> bool {
    before.file_type() == after.file_type()
        && before.mode() == after.mode()
        && before.uid() == after.uid()
        && before.gid() == after.gid()
        && before.len() == after.len()
        && before.modified() == after.modified()
}

/// The entries of the directory `dir` of `fs` by name, without `.` and
/// `..`, each with its metadata, read from its inode as the directory is
/// read: a lookup by path for each would read every directory above it
/// again (a Debian root took 1.4 s so, on both disks).
fn entries(fs: &Ext4, dir: &str) -> io::Result<BTreeMap<Vec<u8>, Metadata>> {
    let mut entries = BTreeMap::new();
    for entry in fs.read_dir(dir).map_err(io::Error::other)? {
        let entry = entry.map_err(io::Error::other)?;
        let name = entry.file_name().as_ref().to_vec();
        if name != b"." && name != b".." {
            entries.insert(name, entry.metadata().map_err(io::Error::other)?);
        }
    }
    Ok(entries)
}

fn child(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    match dir {
        "/" => format!("/{name}"),
        _ => format!("{dir}/{name}"),
    }
}

/// `content` at `host`, replacing what is there, with the entry's
/// permissions, owner and modification time; written beside it and
/// renamed into place, so that a reader sees the old file or the new.
fn replace_file(host: &Path, content: &[u8], metadata: &Metadata) -> io::Result<()> {
    let mut partial = host.as_os_str().to_owned();
    partial.push(".provm-partial");
    let partial = PathBuf::from(partial);
    fs::write(&partial, content)?;
    own(&partial, metadata)?;
    let modified = metadata.modified();
    let since_epoch = Duration::new(
        u64::try_from(modified.seconds()).unwrap_or(0),
        modified.nanoseconds(),
    );
    fs::File::options()
        .write(true)
        .open(&partial)?
        .set_modified(UNIX_EPOCH + since_epoch)?;
    if host.is_dir() {
        fs::remove_dir_all(host)?;
    }
    fs::rename(&partial, host)
}

/// The entry's owner and permissions (set-user-ID and the like included)
/// on `host`; the owner first, since changing it clears set-user-ID.
fn own(host: &Path, metadata: &Metadata) -> io::Result<()> {
    lchown(host, Some(metadata.uid()), Some(metadata.gid()))?;
    fs::set_permissions(
        host,
        fs::Permissions::from_mode(u32::from(metadata.mode()) & 0o7777),
    )
}

/// Removes whatever is at `host` (a directory with what it holds); nothing
/// there is no error.
fn remove(host: &Path) -> io::Result<()> {
    let removed = match fs::symlink_metadata(host) {
        Ok(metadata) if metadata.is_dir() => fs::remove_dir_all(host),
        Ok(_) => fs::remove_file(host),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    removed.or_else(|error| match error.kind() {
        io::ErrorKind::NotFound => Ok(()),
        _ => Err(error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    use provm_engine::disk::file_system;

    fn run(program: &str, args: &[&str]) {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}");
    }

    fn sh(script: &str, dir: &Path) {
        let status = Command::new("sh")
            .args(["-c", script])
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(status.success(), "{script}");
    }

    /// The tree `dir` as an ext4 image's file system, made as the engine
    /// makes a root directory's disk (e2fsprogs' `mkfs.ext4 -d`).
    fn ext4_of(dir: &Path, image: &Path) -> Ext4 {
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-d",
                dir.to_str().unwrap(),
                image.to_str().unwrap(),
                "8M",
            ],
        );
        file_system::open_root(image).unwrap()
    }

    /// A root directory before and after a container's run (the after
    /// tree copied from the before one, times kept, then changed): the
    /// write-back makes a copy of the first the second, except where an
    /// input went.
    #[test]
    fn the_changes_between_two_roots_are_written_back() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = |name: &str| scratch.path().join(name);
        std::fs::create_dir(dir("before")).unwrap();
        sh(
            "mkdir -p sub gone-dir data && echo a > a.txt && echo k > keep.txt && \
             echo b > sub/b.txt && echo g > gone.txt && echo x > gone-dir/x && \
             echo in > data/in.txt && ln -s a.txt link && touch -d @1000000000 a.txt",
            &dir("before"),
        );
        run(
            "cp",
            &[
                "-a",
                dir("before").to_str().unwrap(),
                dir("after").to_str().unwrap(),
            ],
        );
        run(
            "cp",
            &[
                "-a",
                dir("before").to_str().unwrap(),
                dir("rootfs").to_str().unwrap(),
            ],
        );
        sh(
            "echo A > a.txt && chmod 600 keep.txt && echo new > new.txt && \
             echo c > sub/c.txt && rm gone.txt && rm -r gone-dir && ln -s sub link2 && \
             echo changed > data/in.txt",
            &dir("after"),
        );
        let before = ext4_of(&dir("before"), &dir("before.ext4"));
        let after = ext4_of(&dir("after"), &dir("after.ext4"));

        let changes = write_back(&before, &after, &dir("rootfs"), &["/data/".into()]).unwrap();

        assert_eq!(changes.removed, 2, "{changes:?}");
        assert!(changes.skipped.is_empty(), "{changes:?}");
        // The input's folder kept the bundle's content.
        let input = std::fs::read_to_string(dir("rootfs").join("data/in.txt")).unwrap();
        assert_eq!(input, "in\n");
        sh("rm -r before/data after/data rootfs/data", scratch.path());
        let differ = Command::new("diff")
            .args(["-r", "--no-dereference"])
            .arg(dir("rootfs"))
            .arg(dir("after"))
            .output()
            .unwrap();
        assert!(
            differ.status.success(),
            "{}",
            String::from_utf8_lossy(&differ.stdout)
        );
        let mode = |path: &str| {
            std::fs::symlink_metadata(path)
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(
            mode(dir("rootfs").join("keep.txt").to_str().unwrap()),
            0o600
        );
        // Nothing changed, nothing written: a second pass over the result.
        let again = write_back(&after, &after, &dir("rootfs"), &[]).unwrap();
        assert_eq!(again, Changes::default());
    }
}
