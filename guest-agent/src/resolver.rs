//! The guest's resolver configuration under `--net`: written at boot into
//! the initramfs's /etc/resolv.conf, and bound over the image's when a job
//! enters the root, as container runtimes give a container theirs. The
//! image's own file is hidden, not written.

use std::fs::{self, File};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::inputs::make_mount_point;
use crate::root::mount;

/// Where C libraries read the name servers, in the initramfs and the image.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The configuration, open in the initramfs: after the chroot into the
/// image only its descriptor still reaches it.
pub struct ResolverConfig(File);

impl ResolverConfig {
    /// Writes the configuration that names `resolver`, and keeps it open.
    pub fn write(resolver: Ipv4Addr) -> io::Result<ResolverConfig> {
        fs::create_dir_all("/etc")?;
        fs::write(RESOLV_CONF, format!("nameserver {resolver}\n"))?;
        File::open(RESOLV_CONF).map(ResolverConfig)
    }

    /// Binds it over the image's /etc/resolv.conf, made first when the
    /// image lacks it: call it inside the entered root, with /proc mounted
    /// (the bind's source is the descriptor's /proc/self/fd link).
    pub fn bind(&self) -> Result<(), String> {
        let failed = |error: io::Error| format!("cannot give the guest {RESOLV_CONF}: {error}");
        make_room(Path::new(RESOLV_CONF)).map_err(failed)?;
        let source = format!("/proc/self/fd/{}", self.0.as_raw_fd());
        mount(source.as_bytes(), RESOLV_CONF, "", libc::MS_BIND, "").map_err(failed)
    }
}

/// Makes `path` a file to mount on. A symbolic link whose target is missing
/// (systemd-resolved's into /run, which is empty here) gets that target's
/// directory, so the link itself is left as the image has it.
fn make_room(path: &Path) -> io::Result<()> {
    let dangling = path.symlink_metadata().is_ok() && path.metadata().is_err();
    if dangling {
        let target = path
            .parent()
            .unwrap_or(Path::new("/"))
            .join(fs::read_link(path)?);
        if let Some(directory) = target.parent() {
            fs::create_dir_all(directory)?;
        }
    }
    make_mount_point(path, false)
}
