//! The container's root: containerd hands the shim its snapshot's mounts
//! (a bind mount for the native snapshotter, an overlay for overlayfs),
//! which the shim mounts at the bundle's `rootfs`, where config.json's
//! root points and provm-runtime reads it into the guest's disk.
//!
//! Mounted here rather than by the shim library's `mount_rootfs`, which
//! forks and waits through the library's reaper of every child, and so
//! would take the statuses of the runtime's commands the shim waits for.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use containerd_shim::protos::api::Mount;

/// The mount(8) options that are flags of mount(2), as containerd reads
/// them: each sets its flags or, for its opposite, clears them.
const FLAGS: &[(&str, bool, libc::c_ulong)] = &[
    ("ro", false, libc::MS_RDONLY),
    ("rw", true, libc::MS_RDONLY),
    ("bind", false, libc::MS_BIND),
    ("rbind", false, libc::MS_BIND | libc::MS_REC),
    ("nosuid", false, libc::MS_NOSUID),
    ("suid", true, libc::MS_NOSUID),
    ("nodev", false, libc::MS_NODEV),
    ("dev", true, libc::MS_NODEV),
    ("noexec", false, libc::MS_NOEXEC),
    ("exec", true, libc::MS_NOEXEC),
    ("noatime", false, libc::MS_NOATIME),
    ("atime", true, libc::MS_NOATIME),
    ("nodiratime", false, libc::MS_NODIRATIME),
    ("diratime", true, libc::MS_NODIRATIME),
    ("relatime", false, libc::MS_RELATIME),
    ("norelatime", true, libc::MS_RELATIME),
    ("strictatime", false, libc::MS_STRICTATIME),
    ("sync", false, libc::MS_SYNCHRONOUS),
    ("async", true, libc::MS_SYNCHRONOUS),
    ("dirsync", false, libc::MS_DIRSYNC),
];

/// The bundle's root folder.
fn target(bundle: &Path) -> PathBuf {
    bundle.join("rootfs")
}

/// Mounts `mounts`, in their order, at the bundle's `rootfs`.
pub fn mount(mounts: &[Mount], bundle: &Path) -> Result<(), String> {
    let target = target(bundle);
    for (done, mount) in mounts.iter().enumerate() {
        if let Err(error) = mount_one(mount, &target) {
            for _ in 0..done {
                unmount_once(&target).ok();
            }
            return Err(format!(
                "cannot mount the container's root ({} {} at {}): {error}",
                mount.type_,
                mount.source,
                target.display()
            ));
        }
    }
    Ok(())
}

/// Unmounts whatever is mounted at the bundle's `rootfs`.
pub fn unmount(bundle: &Path) -> Result<(), String> {
    let target = target(bundle);
    loop {
        match unmount_once(&target) {
            Ok(()) => {}
            // Nothing (more) mounted there, or no folder.
            Err(error) if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {
                return Ok(())
            }
            Err(error) => {
                return Err(format!(
                    "cannot unmount the container's root {}: {error}",
                    target.display()
                ))
            }
        }
    }
}

/// The flags and the file system's own options (`lowerdir=...`) of
/// `options`.
fn flags_and_data(options: &[String]) -> (libc::c_ulong, String) {
    let mut flags = 0;
    let mut data = Vec::new();
    for option in options {
        match FLAGS.iter().find(|(name, ..)| name == option) {
            Some((_, true, cleared)) => flags &= !cleared,
            Some((_, false, set)) => flags |= set,
            None => data.push(option.as_str()),
        }
    }
    (flags, data.join(","))
}

fn mount_one(mount: &Mount, target: &Path) -> std::io::Result<()> {
    let (flags, data) = flags_and_data(&mount.options);
    let c = |text: &[u8]| CString::new(text).map_err(std::io::Error::other);
    let (source, target) = (
        c(mount.source.as_bytes())?,
        c(target.as_os_str().as_bytes())?,
    );
    let (kind, data) = (c(mount.type_.as_bytes())?, c(data.as_bytes())?);
    let call = |flags: libc::c_ulong| {
        // SAFETY: mount reads the NUL-terminated strings, which outlive the
        // call.
        match unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                kind.as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
        } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    call(flags)?;
    // A bind mount takes its own flags (read-only) only when remounted.
    let own = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    if flags & libc::MS_BIND != 0 && flags & own != 0 {
        call(flags | libc::MS_REMOUNT)?;
    }
    Ok(())
}

fn unmount_once(target: &Path) -> std::io::Result<()> {
    let path = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: umount2 reads the NUL-terminated path, which outlives the call.
    match unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_set_and_cleared_and_the_rest_is_the_file_systems() {
        let options = ["rbind", "ro", "rw", "nosuid", "lowerdir=/a:/b", "index=off"];
        let options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        let (flags, data) = flags_and_data(&options);
        assert_eq!(flags, libc::MS_BIND | libc::MS_REC | libc::MS_NOSUID);
        assert_eq!(data, "lowerdir=/a:/b,index=off");
    }
}
