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

/// The kernel's file systems every root gets: (type, mount point).
const API_FILESYSTEMS: [(&str, &str); 3] =
    [("devtmpfs", "/dev"), ("proc", "/proc"), ("sysfs", "/sys")];

/// Mounts devtmpfs, proc and sysfs on `under`/dev, /proc and /sys. With
/// `create`, missing mount points are made; without, they are skipped (an
/// image need not have a /sys).
pub fn mount_api_filesystems(under: &str, create: bool) -> Result<(), String> {
    for (fstype, dir) in API_FILESYSTEMS {
        let target = format!("{under}{dir}");
        if create {
            // An existing directory is fine; a real problem shows in mount().
            let _ = fs::create_dir(&target);
        }
        match mount(fstype.as_bytes(), &target, fstype) {
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
        mount(device, MOUNT_POINT, "ext4").map_err(|error| {
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
        if unsafe { libc::fchdir(self.initramfs.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        chroot(".")?;
        detach(MOUNT_POINT)
    }
}

fn mount(source: &[u8], target: &str, fstype: &str) -> io::Result<()> {
    let (source, target, fstype) = (
        CString::new(source)?,
        CString::new(target)?,
        CString::new(fstype)?,
    );
    let flags = 0;
    let data = ptr::null();
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
fn detach(target: &str) -> io::Result<()> {
    let target = CString::new(target)?;
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
