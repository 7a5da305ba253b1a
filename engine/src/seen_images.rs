//! Where this host last saw the image of each digest. A trace names its
//! image by file name and digest only (see `host_paths`); so that `provm
//! replay run.provm` still finds the image on the host that recorded it,
//! `provm record` notes the image's absolute path here, in provm's cache,
//! which never leaves the host. Replay checks the digests of whatever it
//! finds, so a stale note costs nothing but a refusal.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::kernel::cache_dir;

fn note(sha256: &str) -> PathBuf {
    cache_dir().join("images-seen").join(sha256)
}

/// Notes that the image whose file has `sha256` is at `image`. Only a
/// convenience for later replays here: a failure is logged, not raised.
pub fn remember(image: &Path, sha256: &str) {
    let note = note(sha256);
    let written = std::fs::canonicalize(image).and_then(|absolute| {
        std::fs::create_dir_all(note.parent().expect("a note is in a directory"))?;
        std::fs::write(&note, absolute.as_os_str().as_bytes())
    });
    if let Err(error) = written {
        tracing::debug!(
            "cannot note where the image is in {}: {error}",
            note.display()
        );
    }
}

/// Where this host last saw the image whose file has `sha256`, if it is
/// still there.
pub fn recall(sha256: &str) -> Option<PathBuf> {
    let bytes = std::fs::read(note(sha256)).ok()?;
    let path = PathBuf::from(OsString::from_vec(bytes));
    path.exists().then_some(path)
}
