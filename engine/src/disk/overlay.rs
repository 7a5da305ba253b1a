//! Where the guest's writes go: a fresh qcow2 overlay over the image, so
//! that the image itself is never written. A temporary overlay is unlinked
//! as soon as it is open; `--keep-overlay` keeps it where the user asked.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use provm_vmm::disk::image::{BaseImage, Durability, ImageError, Overlay};

/// Where an overlay's file lives, and whether it outlives the run.
#[derive(Debug, Clone)]
pub enum OverlayLocation {
    /// A fresh, uniquely named file in this directory, unlinked as soon as
    /// it is open.
    TempIn(PathBuf),
    /// Exactly this path (`--keep-overlay`), which must not exist yet; kept,
    /// and a consistent qcow2 image once the VM is gone.
    Keep(PathBuf),
}

impl OverlayLocation {
    /// A temporary overlay in the system's temporary directory.
    pub fn temporary() -> OverlayLocation {
        OverlayLocation::TempIn(std::env::temp_dir())
    }
}

/// Creates the guest's disk: an overlay over `base` at `location`.
pub fn create(base: &BaseImage, location: OverlayLocation) -> Result<Overlay, ImageError> {
    match location {
        OverlayLocation::TempIn(dir) => {
            let path = dir.join(temp_overlay_name());
            let overlay = Overlay::create(base, &path, Durability::Unsynced)?;
            // The open descriptors are all the overlay needs from here on:
            // unlinking it now means no exit, however abrupt, leaves it behind.
            if let Err(e) = fs::remove_file(&path) {
                tracing::warn!("cannot delete overlay {}: {e}", path.display());
            }
            Ok(overlay)
        }
        OverlayLocation::Keep(path) => Overlay::create(base, &path, Durability::Synced),
    }
}

/// A name no other provm process or overlay in this process uses.
fn temp_overlay_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("provm-overlay-{}-{nanos}-{n}.qcow2", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_vmm::disk::Disk;

    const MIB: usize = 1 << 20;

    fn base(dir: &std::path::Path) -> BaseImage {
        let path = dir.join("base.img");
        fs::write(&path, vec![3; MIB]).unwrap();
        BaseImage::open(&path).unwrap()
    }

    fn files_in(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn temporary_overlay_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = base(dir.path());
        let location = OverlayLocation::TempIn(dir.path().to_path_buf());
        let mut overlay = create(&base, location).unwrap();
        assert_eq!(files_in(dir.path()), ["base.img"]);
        overlay.write_at(0, &[1; 512]).unwrap();
        overlay.flush().unwrap();
        let mut sectors = [0; 1024];
        overlay.read_at(0, &mut sectors).unwrap();
        assert_eq!(sectors[..512], [1; 512]);
        assert_eq!(sectors[512..], [3; 512]);
    }

    #[test]
    fn kept_overlay_outlives_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let base = base(dir.path());
        let kept = dir.path().join("kept.qcow2");
        let mut overlay = create(&base, OverlayLocation::Keep(kept.clone())).unwrap();
        overlay.write_at(0, &[1; 512]).unwrap();
        drop(overlay);
        let mut reopened = BaseImage::open(&kept).unwrap();
        let mut sector = [0; 512];
        reopened.read_at(0, &mut sector).unwrap();
        assert_eq!(sector, [1; 512]);
    }

    #[test]
    fn temporary_overlays_have_distinct_names() {
        assert_ne!(temp_overlay_name(), temp_overlay_name());
    }
}
