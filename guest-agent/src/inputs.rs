//! A job's data in: the host's input trees, each filled into a tmpfs of its
//! own and then mounted read-only at its guest path (hiding what the image
//! has there, as `docker run -v` does), and the command's standard input,
//! kept in a memory file.
//!
//! Memory, not the image's disk: the guest's disk writes are logged in the
//! trace, and the input is in it already (every byte the host sends is);
//! the host checks that the inputs fit the guest's memory. Large inputs
//! come on the input disk instead (`Job::input_disk`): its file system is
//! mounted read-only and each input bound from it to its guest path.
//!
//! An input whose guest path is an output too (a container's read-write
//! volume: it goes in, and what the command left there comes back) is
//! placed writable: its tmpfs is not sealed, and one from the input disk
//! is copied into a tmpfs of its own first.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use provm_guest_agent::tree::stays_inside;
use provm_guest_agent::{Entry, EntryContent, HostMessage, Job};

use crate::root::{detach, mount};

/// Where the inputs are filled before they are mounted in place: a
/// directory on the image's root, removed again once they are.
const STAGING: &str = "/.provm-inputs";
/// The input disk, the machine's second virtio-blk device.
const INPUT_DISK: &[u8] = b"/dev/vdb";
/// BLKFLSBUF (linux/fs.h: `_IO(0x12, 97)`), which the libc crate lacks.
const BLKFLSBUF: libc::c_ulong = 0x1261;
/// BLKRASET (linux/fs.h: `_IO(0x12, 98)`): the device's read-ahead, in
/// 512-byte sectors; the libc crate lacks it too.
const BLKRASET: libc::c_ulong = 0x1262;
/// The input disk's read-ahead: 8 MiB, not the kernel's 128 KiB. Inputs
/// are read whole, front to back, and each request costs exits: reading 1
/// GiB with `cat` took 23.0 s in 8219 requests at 128 KiB on the SVM test
/// bed, 8.4 s in 950 at 8 MiB. (On PVM the guest kernel's copy of each
/// page is the cost, whatever the requests: 64 MiB in 14 to 16 s either
/// way.)
const INPUT_DISK_READ_AHEAD_SECTORS: libc::c_ulong = (8 << 20) / 512;

/// The inputs and standard input of one job, as they arrive.
pub struct Inputs {
    /// Each input's guest path, its staging directory, and whether it is
    /// placed writable.
    trees: Vec<(PathBuf, PathBuf, bool)>,
    stdin: Option<File>,
    /// The regular file `Data` entries go to, and its path.
    open_file: Option<(PathBuf, File)>,
}

impl Inputs {
    /// Prepares for `job`'s data: a tmpfs per input, a memory file for its
    /// standard input if it has one.
    pub fn begin(job: &Job) -> Result<Inputs, String> {
        let mut trees = Vec::new();
        let writable = |guest_path: &Vec<u8>| job.outputs.contains(guest_path);
        let on_channel = if job.input_disk {
            place_from_disk(&job.inputs, writable)?;
            &[][..]
        } else {
            &job.inputs[..]
        };
        for (index, guest_path) in on_channel.iter().enumerate() {
            let staging = Path::new(STAGING).join(index.to_string());
            make_tmpfs(&staging)?;
            trees.push((
                PathBuf::from(std::ffi::OsStr::from_bytes(guest_path)),
                staging,
                writable(guest_path),
            ));
        }
        let stdin = job.stdin.then(memory_file).transpose()?;
        Ok(Inputs {
            trees,
            stdin,
            open_file: None,
        })
    }

    /// Whether data messages follow the job (else it has no DataEnd).
    pub fn come_on_channel(&self) -> bool {
        !self.trees.is_empty() || self.stdin.is_some()
    }

    /// Stores one data message.
    pub fn take(&mut self, message: HostMessage) -> Result<(), String> {
        match message {
            HostMessage::Entry(entry) => self.store(entry),
            HostMessage::Stdin(bytes) => self
                .stdin
                .as_mut()
                .ok_or("standard input came for a job without it")?
                .write_all(&bytes)
                .map_err(|error| format!("cannot keep the command's standard input: {error}")),
            other => Err(format!("{other:?} came among the job's data")),
        }
    }

    fn store(&mut self, entry: Entry) -> Result<(), String> {
        let (_, staging, _) = self
            .trees
            .get(entry.tree as usize)
            .ok_or_else(|| format!("an entry for input {}, which the job lacks", entry.tree))?;
        if !stays_inside(&entry.path) {
            let path = String::from_utf8_lossy(&entry.path);
            return Err(format!("an input entry {path:?} leaves its tree"));
        }
        let path = staged_path(staging, &entry.path);
        let failed = |error: std::io::Error| {
            format!("cannot store the input file {}: {error}", path.display())
        };
        match entry.content {
            EntryContent::Dir { mode } => {
                fs::create_dir_all(&path).map_err(failed)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(failed)?;
            }
            EntryContent::File { mode } => {
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&path)
                    .map_err(failed)?;
                self.open_file = Some((path, file));
            }
            EntryContent::Data(bytes) => match &mut self.open_file {
                Some((open, file)) if *open == path => file.write_all(&bytes).map_err(failed)?,
                _ => return Err(format!("content for {} before the file", path.display())),
            },
            EntryContent::Symlink(target) => {
                symlink(std::ffi::OsStr::from_bytes(&target), &path).map_err(failed)?
            }
            EntryContent::Missing => return Err("an input with nothing in it".into()),
        }
        Ok(())
    }

    /// Mounts every input at its guest path, read-only unless it is
    /// writable, and gives the command's standard input, from its start.
    pub fn finish(mut self) -> Result<Option<File>, String> {
        self.open_file = None;
        for (guest_path, staging, writable) in &self.trees {
            place(guest_path, staging, *writable)?;
        }
        if !self.trees.is_empty() {
            // Empty now: each input's tmpfs went with its staging mount.
            let _ = fs::remove_dir_all(STAGING);
        }
        if let Some(stdin) = &mut self.stdin {
            stdin
                .rewind()
                .map_err(|error| format!("cannot rewind the standard input: {error}"))?;
        }
        Ok(self.stdin)
    }
}

/// Where an entry with the relative `path` is staged: the tree's root is
/// `root` in the staging directory, a file or a directory.
fn staged_path(staging: &Path, path: &[u8]) -> PathBuf {
    let root = staging.join("root");
    if path.is_empty() {
        root
    } else {
        root.join(std::ffi::OsStr::from_bytes(path))
    }
}

/// A tmpfs of its own at `staging`, for one input.
fn make_tmpfs(staging: &Path) -> Result<(), String> {
    let mounted = fs::create_dir_all(staging).and_then(|()| {
        let target = staging.to_string_lossy();
        mount(b"tmpfs", &target, "tmpfs", 0, "mode=0755")
    });
    mounted.map_err(|error| {
        format!(
            "cannot make room for an input at {}: {error}",
            staging.display()
        )
    })
}

/// Makes the staged tree read-only unless `writable`, and binds it over
/// `guest_path` (made first when missing, with its parents, of the tree
/// root's kind).
fn place(guest_path: &Path, staging: &Path, writable: bool) -> Result<(), String> {
    let failed = |what: &str, error: std::io::Error| {
        format!(
            "cannot {what} the input at {}: {error}",
            guest_path.display()
        )
    };
    let staging_name = staging.to_string_lossy();
    if !writable {
        mount(
            b"",
            &staging_name,
            "",
            libc::MS_REMOUNT | libc::MS_RDONLY,
            "",
        )
        .map_err(|error| failed("seal", error))?;
    }
    bind(&staged_path(staging, b""), guest_path)?;
    // The bind keeps the tmpfs; its staging mount is no longer needed.
    detach(&staging_name).map_err(|error| failed("unstage", error))
}

/// Binds `root` (a file or a directory) over `guest_path`.
fn bind(root: &Path, guest_path: &Path) -> Result<(), String> {
    let failed = |what: &str, error: std::io::Error| {
        format!(
            "cannot {what} the input at {}: {error}",
            guest_path.display()
        )
    };
    let is_dir = root
        .symlink_metadata()
        .map_err(|error| failed("find", error))?
        .is_dir();
    make_mount_point(guest_path, is_dir).map_err(|error| failed("make room for", error))?;
    let (root, target) = (root.to_string_lossy(), guest_path.to_string_lossy());
    mount(root.as_bytes(), &target, "", libc::MS_BIND, "").map_err(|error| failed("mount", error))
}

/// Mounts the input disk read-only and binds input N, its /N, over the
/// Nth of `guest_paths`; a `writable` one is copied into a tmpfs first.
fn place_from_disk(
    guest_paths: &[Vec<u8>],
    writable: impl Fn(&Vec<u8>) -> bool,
) -> Result<(), String> {
    let failed =
        |what: &str, error: std::io::Error| format!("cannot {what} the input disk: {error}");
    // The kernel read the disk at boot, when it held only zeros: what it
    // kept of them must go before the file system is read.
    let disk = File::open(std::ffi::OsStr::from_bytes(INPUT_DISK))
        .map_err(|error| failed("open", error))?;
    block_ioctl(&disk, BLKFLSBUF, 0)
        .map_err(|error| failed("forget the boot's reads of", error))?;
    // Set before the mount: files opened on the file system take it then.
    block_ioctl(&disk, BLKRASET, INPUT_DISK_READ_AHEAD_SECTORS)
        .map_err(|error| failed("set the read-ahead of", error))?;
    let mounted = Path::new(STAGING).join("disk");
    fs::create_dir_all(&mounted).map_err(|error| failed("make room for", error))?;
    let mounted_name = mounted.to_string_lossy();
    mount(INPUT_DISK, &mounted_name, "ext4", libc::MS_RDONLY, "")
        .map_err(|error| failed("mount", error))?;
    for (index, guest_path) in guest_paths.iter().enumerate() {
        let on_disk = mounted.join(index.to_string());
        let place_path = Path::new(std::ffi::OsStr::from_bytes(guest_path));
        if !writable(guest_path) {
            bind(&on_disk, place_path)?;
            continue;
        }
        let staging = Path::new(STAGING).join(format!("writable-{index}"));
        make_tmpfs(&staging)?;
        copy_tree(&on_disk, &staged_path(&staging, b"")).map_err(|error| {
            format!(
                "cannot copy the input at {} to make it writable: {error}",
                place_path.display()
            )
        })?;
        place(place_path, &staging, true)?;
    }
    // The binds keep the file system mounted.
    detach(&mounted_name).map_err(|error| failed("unstage", error))?;
    let _ = fs::remove_dir_all(STAGING);
    Ok(())
}

/// Copies the tree at `from` (a file, a link or a directory) to `to`, with
/// its permissions; the owner is root's, as the input disk's is.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let metadata = from.symlink_metadata()?;
    if metadata.is_symlink() {
        return symlink(fs::read_link(from)?, to);
    }
    if metadata.is_file() {
        fs::copy(from, to)?;
        return Ok(());
    }
    fs::create_dir(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        copy_tree(&entry.path(), &to.join(entry.file_name()))?;
    }
    fs::set_permissions(to, metadata.permissions())
}

/// A block device ioctl whose argument is a value, not a pointer
/// (BLKFLSBUF, BLKRASET).
fn block_ioctl(disk: &File, request: libc::c_ulong, value: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: the descriptor is open, and these requests read no memory.
    match unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(disk), request, value) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

pub fn make_mount_point(path: &Path, dir: bool) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    // Followed: an image's symbolic link to a directory is a fine place.
    match (path.metadata(), dir) {
        (Ok(existing), _) if existing.is_dir() == dir => Ok(()),
        (Ok(_), _) => Err(std::io::Error::other(if dir {
            "the image has a file there, and the input is a directory"
        } else {
            "the image has a directory there, and the input is a file"
        })),
        (Err(_), true) => fs::create_dir(path),
        (Err(_), false) => File::create(path).map(drop),
    }
}

/// An anonymous file in memory, for the command's standard input.
fn memory_file() -> Result<File, String> {
    // SAFETY: memfd_create(2) reads the NUL-terminated literal, which is
    // 'static; the descriptor it returns is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"stdin".as_ptr(), 0) };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(format!("cannot hold the standard input: {error}"));
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}
