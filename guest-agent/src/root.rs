//! File systems: the kernel's own (/dev, /proc, /sys) and the image's root,
//! which the agent mounts from the job's block device and enters with chroot.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::chroot;
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

/// The image's root file system, mounted and entered.
pub struct Root {
    device: Vec<u8>,
    /// The initramfs's root directory, kept to leave the chroot at power-off.
    initramfs: File,
}

impl Root {
    /// Mounts `device` as ext4 (the guest kernel's only disk file system) with
    /// the kernel's file systems inside, and makes it the agent's root. On
    /// failure nothing stays mounted, so a later job may try again.
    pub fn enter(device: &[u8]) -> Result<Root, String> {
        let initramfs =
            File::open("/").map_err(|error| format!("cannot open the initramfs root: {error}"))?;
        fs::create_dir_all(MOUNT_POINT)
            .map_err(|error| format!("cannot create {MOUNT_POINT}: {error}"))?;
        // noinit_itable: no ext4lazyinit thread zeroing the image's unused
        // inode tables in the background. Its writes went to an overlay
        // that is thrown away, on a timer of its own (a disk write that
        // depends on timing), and cost 74 ms of each run where guest
        // ring 0 is emulated.
        mount(device, MOUNT_POINT, "ext4", 0, "noinit_itable").map_err(|error| {
            let device = String::from_utf8_lossy(device);
            format!("cannot mount {device} (ext4) on {MOUNT_POINT}: {error}")
        })?;
        let entered = mount_api_filesystems(MOUNT_POINT, false).and_then(|()| {
            chroot(MOUNT_POINT)
                .and_then(|()| env::set_current_dir("/"))
                .map_err(|error| format!("cannot chroot into {MOUNT_POINT}: {error}"))
        });
        if entered.is_err() {
            // Detaching takes the kernel file systems mounted inside with it.
            let _ = detach(MOUNT_POINT);
        }
        entered.map(|()| Root {
            device: device.to_vec(),
            initramfs,
        })
    }

    /// The block device the root was mounted from.
    pub fn device(&self) -> &[u8] {
        &self.device
    }

    /// Leaves the image for the initramfs and unmounts it. Call it with no
    /// other process left: then nothing holds the file system, and the lazy
    /// unmount shuts it down (cleanly, journal and all) before returning.
    pub fn unmount(&self) -> io::Result<()> {
        // SAFETY: `self.initramfs` is an open descriptor this `Root` owns;
        // fchdir(2) only reads its number.
        if unsafe { libc::fchdir(self.initramfs.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        chroot(".")?;
        detach(MOUNT_POINT)
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
