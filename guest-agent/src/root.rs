//! File systems: the kernel's own (/dev, /proc, /sys) and the image's root,
//! which the agent mounts from the job's block device and enters with chroot.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{chroot, FileExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::{env, ptr};

/// Where the image's root is mounted in the initramfs.
const MOUNT_POINT: &str = "/mnt/root";

/// A kernel file system every root gets.
struct ApiFilesystem {
    fstype: &'static str,
    target: &'static str,
    /// Mount options, as mount(8)'s -o takes them.
    options: &'static str,
    /// Whether the mount point is made when missing: those under /dev are
    /// ours (devtmpfs); the rest are the image's, never created in it.
    create: bool,
}

/// What a container runtime mounts, in order (/dev before what goes in it):
/// shared memory and POSIX semaphores (/dev/shm: Python's multiprocessing),
/// pseudo-terminals, POSIX message queues, and a tmpfs /run.
const API_FILESYSTEMS: [ApiFilesystem; 7] = [
    api("devtmpfs", "/dev", "", true),
    api("proc", "/proc", "", true),
    api("sysfs", "/sys", "", true),
    api("tmpfs", "/dev/shm", "mode=1777", true),
    api("devpts", "/dev/pts", "mode=0620,ptmxmode=0666", true),
    api("mqueue", "/dev/mqueue", "", true),
    api("tmpfs", "/run", "mode=0755", false),
];

const fn api(
    fstype: &'static str,
    target: &'static str,
    options: &'static str,
    create: bool,
) -> ApiFilesystem {
    ApiFilesystem {
        fstype,
        target,
        options,
        create,
    }
}

/// Mounts the kernel's file systems under `under` (the initramfs's root
/// is ""). With `create_all`, every missing mount point is made; without,
/// those in the image are skipped when missing (an image need not have a
/// /sys or a /run).
pub fn mount_api_filesystems(under: &str, create_all: bool) -> Result<(), String> {
    for filesystem in API_FILESYSTEMS {
        let target = format!("{under}{}", filesystem.target);
        if create_all || filesystem.create {
            // An existing directory is fine; a real problem shows in mount().
            let _ = fs::create_dir(&target);
        }
        let ApiFilesystem {
            fstype, options, ..
        } = filesystem;
        match mount(fstype.as_bytes(), &target, fstype, 0, options) {
            Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::EBUSY)) => {}
            result => {
                result.map_err(|error| format!("cannot mount {fstype} on {target}: {error}"))?
            }
        }
    }
    Ok(())
}

/// The image's root file system, mounted but not yet entered: read-only at
/// boot, before the agent says Ready, so that the mount's work (ext4's
/// superblock, journal and threads: about a fifth of a short run where guest
/// ring 0 is emulated) is part of the booted snapshot instead of every job.
pub struct Mounted {
    device: Vec<u8>,
}

impl Mounted {
    /// Mounts `device` read-only if its ext4 file system is clean. A
    /// read-only mount of a clean ext4 writes nothing, which matters: the
    /// snapshot taken after it is restored over a fresh, empty overlay.
    /// A journal to replay or orphans to clean up would be written even
    /// read-only, so such a file system is left for the job to mount.
    pub fn read_only_if_clean(device: &[u8]) -> Result<Mounted, String> {
        let name = String::from_utf8_lossy(device);
        let superblock = read_superblock(device)
            .map_err(|error| format!("cannot read the superblock of {name}: {error}"))?;
        if let Some(reason) = unclean(&superblock) {
            return Err(format!("{name} is left for the job to mount: {reason}"));
        }
        mount_image_root(device, libc::MS_RDONLY)?;
        Ok(Mounted {
            device: device.to_vec(),
        })
    }

    /// The block device it was mounted from.
    pub fn device(&self) -> &[u8] {
        &self.device
    }

    /// Runs the image's `/bin/sh -c :` inside it once, so that what the
    /// shell maps (itself and, if it is dynamic, its loader and libc) is
    /// in the booted snapshot's page cache instead of read from the disk
    /// again by every job: jobs start a shell, or another program of the
    /// same busybox or libc. Where guest ring 0 is emulated that reading
    /// is 0.9 s of a short job. The mount is read-only, so nothing is
    /// written; an image without a working /bin/sh is only slower.
    pub fn warm_shell(&self) -> io::Result<()> {
        let root = CString::new(MOUNT_POINT)?;
        let mut shell = Command::new("/bin/sh");
        shell
            .args(["-c", ":"])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec the closure only makes system
        // calls, with strings made before the fork.
        unsafe {
            shell.pre_exec(move || {
                // Its working directory inside the root too, as a job's.
                if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let status = shell.status()?;
        match status.success() {
            true => Ok(()),
            false => Err(io::Error::other(format!(
                "/bin/sh -c : ended with {status}"
            ))),
        }
    }

    /// Makes it writable (ext4 then starts its journal's writes and stamps
    /// the superblock with the time of mount) and enters it.
    pub fn enter(self) -> Result<Root, String> {
        let remounted = mount(
            &self.device,
            MOUNT_POINT,
            "ext4",
            libc::MS_REMOUNT | WRITABLE_ROOT_FLAGS,
            IMAGE_ROOT_OPTIONS,
        )
        .map_err(|error| format!("cannot make the root writable: {error}"));
        if let Err(reason) = remounted {
            let _ = detach(MOUNT_POINT);
            return Err(reason);
        }
        Root::enter_mounted(&self.device)
    }

    /// Unmounts it, for a job that names another device.
    pub fn unmount(self) -> io::Result<()> {
        detach(MOUNT_POINT)
    }
}

/// The ext4 mount options of the image's root. noinit_itable: no
/// ext4lazyinit thread zeroing the image's unused inode tables in the
/// background. Its writes went to an overlay that is thrown away, on a
/// timer of its own (a disk write that depends on timing), and cost 74 ms
/// of each run where guest ring 0 is emulated.
const IMAGE_ROOT_OPTIONS: &str = "noinit_itable";

/// The writable root's mount flags. noatime: reading a file leaves its
/// inode as it was, so a command that only reads the image leaves nothing
/// for the power-off's sync to write (under relatime, the first read of
/// each of the image's files dirtied its inode).
const WRITABLE_ROOT_FLAGS: libc::c_ulong = libc::MS_NOATIME;

fn mount_image_root(device: &[u8], flags: libc::c_ulong) -> Result<(), String> {
    fs::create_dir_all(MOUNT_POINT)
        .map_err(|error| format!("cannot create {MOUNT_POINT}: {error}"))?;
    mount(device, MOUNT_POINT, "ext4", flags, IMAGE_ROOT_OPTIONS).map_err(|error| {
        let device = String::from_utf8_lossy(device);
        format!("cannot mount {device} (ext4) on {MOUNT_POINT}: {error}")
    })
}

/// Bytes of an ext4 superblock, which starts 1024 bytes into the device.
const SUPERBLOCK_OFFSET: u64 = 1024;
const SUPERBLOCK_LEN: usize = 1024;

fn read_superblock(device: &[u8]) -> io::Result<[u8; SUPERBLOCK_LEN]> {
    let device = File::open(std::ffi::OsStr::from_bytes(device))?;
    let mut superblock = [0; SUPERBLOCK_LEN];
    device.read_exact_at(&mut superblock, SUPERBLOCK_OFFSET)?;
    Ok(superblock)
}

/// Why mounting this superblock read-only could write to the disk or
/// fail, if it could. The fields' offsets are those of the kernel's
/// `struct ext4_super_block` (fs/ext4/ext4.h), read by hand because the
/// agent runs in a bare initramfs with nothing but the kernel.
fn unclean(superblock: &[u8; SUPERBLOCK_LEN]) -> Option<&'static str> {
    let le16 = |at: usize| u16::from_le_bytes([superblock[at], superblock[at + 1]]);
    let le32 = |at: usize| u32::from_le_bytes(superblock[at..at + 4].try_into().unwrap());
    const EXT4_MAGIC: u16 = 0xef53;
    const STATE_VALID: u16 = 0x1;
    const INCOMPAT_RECOVER: u32 = 0x4;
    if le16(0x38) != EXT4_MAGIC {
        return Some("not an ext4 file system");
    }
    if le16(0x3a) & STATE_VALID == 0 {
        return Some("not cleanly unmounted, or has errors");
    }
    if le32(0x60) & INCOMPAT_RECOVER != 0 {
        return Some("its journal needs replaying");
    }
    if le32(0xe8) != 0 {
        return Some("it has orphaned inodes to clean up");
    }
    None
}

/// The image's root file system, mounted and entered.
pub struct Root {
    device: Vec<u8>,
    /// Left clean at power-off, not only synced (`write_back`).
    pub leave_clean: bool,
}

impl Root {
    /// Mounts `device` as ext4 (the guest kernel's only disk file system) with
    /// the kernel's file systems inside, and makes it the agent's root. On
    /// failure nothing stays mounted, so a later job may try again.
    pub fn enter(device: &[u8]) -> Result<Root, String> {
        mount_image_root(device, WRITABLE_ROOT_FLAGS)?;
        Root::enter_mounted(device)
    }

    /// Mounts the kernel's file systems inside the root mounted from
    /// `device` and enters it; on failure, unmounts it.
    fn enter_mounted(device: &[u8]) -> Result<Root, String> {
        let entered = mount_api_filesystems(MOUNT_POINT, false).and_then(|()| {
            chroot(MOUNT_POINT)
                .and_then(|()| env::set_current_dir("/"))
                .map_err(|error| format!("cannot chroot into {MOUNT_POINT}: {error}"))
        });
        match entered {
            Ok(()) => Ok(Root {
                device: device.to_vec(),
                leave_clean: true,
            }),
            Err(reason) => {
                // Detaching takes the kernel file systems mounted inside with it.
                let _ = detach(MOUNT_POINT);
                Err(reason)
            }
        }
    }

    /// The block device the root was mounted from.
    pub fn device(&self) -> &[u8] {
        &self.device
    }

    /// Writes what the jobs left in memory to the disk, for the power-off.
    /// Where the disk is read after the run (`leave_clean`), the file
    /// system is left clean, as unmounting it would leave it (the journal
    /// written back, nothing left to replay), by remounting it read-only;
    /// unmounting would also drop every cached page and inode, work thrown
    /// away with the guest. Elsewhere a sync is enough: the disk goes with
    /// the guest, and the remount's own writes (the journal's and the
    /// superblock's, each waited for) took 211 ms of a `true`'s 1.25 s of
    /// guest time where guest ring 0 is emulated. Call it with no other
    /// process left: a file open for writing keeps the file system
    /// writable (EBUSY).
    pub fn write_back(&self) -> io::Result<()> {
        if !self.leave_clean {
            // SAFETY: sync(2) takes no arguments.
            unsafe { libc::sync() };
            return Ok(());
        }
        // The agent's root is the image's (Root::enter_mounted).
        mount(b"none", "/", "ext4", libc::MS_REMOUNT | libc::MS_RDONLY, "")
    }
}

/// mount(2) of `source` on `target`, with `flags` (MS_*) and `options` as
/// mount(8)'s -o takes them.
pub(crate) fn mount(
    source: &[u8],
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    options: &str,
) -> io::Result<()> {
    let (source, target, fstype, options) = (
        CString::new(source)?,
        CString::new(target)?,
        CString::new(fstype)?,
        CString::new(options)?,
    );
    let data = if options.is_empty() {
        ptr::null()
    } else {
        options.as_ptr().cast()
    };
    // SAFETY: every pointer is a NUL-terminated CString (or null for no
    // options) that lives until the end of this function, past the call;
    // mount(2) only reads them.
    let result = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Lazily unmounts `target` and everything mounted below it.
pub(crate) fn detach(target: &str) -> io::Result<()> {
    let target = CString::new(target)?;
    // SAFETY: `target` is a NUL-terminated CString alive for the call,
    // which only reads it.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superblock of a clean ext4 file system, as mkfs.ext4 leaves it:
    /// the magic, the state "valid", no incompatible feature that needs
    /// recovery, no orphan.
    fn clean() -> [u8; SUPERBLOCK_LEN] {
        let mut superblock = [0; SUPERBLOCK_LEN];
        superblock[0x38..0x3a].copy_from_slice(&0xef53u16.to_le_bytes());
        superblock[0x3a..0x3c].copy_from_slice(&1u16.to_le_bytes());
        // extents, 64bit, flex_bg, filetype: set, and harmless.
        superblock[0x60..0x64].copy_from_slice(&0x2c2u32.to_le_bytes());
        superblock
    }

    #[test]
    fn only_a_clean_ext4_is_mounted_before_the_first_job() {
        assert_eq!(unclean(&clean()), None);
        let mut not_ext4 = clean();
        not_ext4[0x38] = 0;
        assert_eq!(unclean(&not_ext4), Some("not an ext4 file system"));
        let mut in_use = clean();
        in_use[0x3a] = 0;
        assert!(unclean(&in_use).unwrap().contains("not cleanly unmounted"));
        let mut journal = clean();
        journal[0x60] |= 0x4;
        assert!(unclean(&journal).unwrap().contains("journal"));
        let mut orphans = clean();
        orphans[0xe8] = 12;
        assert!(unclean(&orphans).unwrap().contains("orphan"));
    }
}
