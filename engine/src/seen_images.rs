//! Where this host has seen the image of each digest. A trace names its
//! image by file name and digest only (see `host_paths`); so that `provm
//! replay run.provm` still finds the image on the host that recorded it,
//! `provm record` notes the image's absolute path here, in provm's cache,
//! which never leaves the host. A digest keeps its last few paths, not
//! only the last: a copy recorded from a folder since removed must not
//! hide the image that is still where it was. Replay checks the digests of
//! whatever it finds, so a stale note costs nothing but a refusal.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::digest::write_atomically;
use crate::kernel::cache_dir;

/// How many paths a digest's note keeps, the newest last.
const PATHS_KEPT: usize = 8;

fn note(sha256: &str) -> PathBuf {
    cache_dir().join("images-seen").join(sha256)
}

/// Notes that the image whose file has `sha256` is at `image`. Only a
/// convenience for later replays here: a failure is logged, not raised.
pub fn remember(image: &Path, sha256: &str) {
    let note = note(sha256);
    let written = std::fs::canonicalize(image)
        .and_then(|absolute| write_atomically(&note, &noted(read(&note), absolute)));
    if let Err(error) = written {
        tracing::debug!(
            "cannot note where the image is in {}: {error}",
            note.display()
        );
    }
}

/// Where this host last saw the image whose file has `sha256` and it is
/// still there.
pub fn recall(sha256: &str) -> Option<PathBuf> {
    read(&note(sha256))
        .into_iter()
        .rev()
        .find(|path| path.exists())
}

/// The paths a note holds (none if it cannot be read).
fn read(note: &Path) -> Vec<PathBuf> {
    parse(&std::fs::read(note).unwrap_or_default())
}

/// A note's paths, one per line, the newest last.
fn parse(text: &[u8]) -> Vec<PathBuf> {
    text.split(|&byte| byte == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| PathBuf::from(OsString::from_vec(line.to_vec())))
        .collect()
}

/// The note's text with `seen` as its newest path: the others still there
/// kept, up to `PATHS_KEPT` in all.
fn noted(mut paths: Vec<PathBuf>, seen: PathBuf) -> Vec<u8> {
    paths.retain(|path| *path != seen && path.exists());
    paths.push(seen);
    let start = paths.len().saturating_sub(PATHS_KEPT);
    let mut text = Vec::new();
    for path in &paths[start..] {
        text.extend_from_slice(path.as_os_str().as_bytes());
        text.push(b'\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files named `names` in a new folder, which they live as long as.
    fn images(names: &[&str]) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let paths = names.iter().map(|name| dir.path().join(name)).collect();
        for path in &paths {
            std::fs::write(path, b"image").unwrap();
        }
        (dir, paths)
    }

    #[test]
    fn an_image_stays_found_after_a_copy_seen_later_is_removed() {
        let (_dir, paths) = images(&["image.qcow2", "copy.qcow2"]);
        let [image, copy] = [paths[0].clone(), paths[1].clone()];
        let text = noted(parse(&noted(Vec::new(), image.clone())), copy.clone());
        assert_eq!(parse(&text), [image.clone(), copy.clone()]);
        std::fs::remove_file(&copy).unwrap();
        let found = parse(&text).into_iter().rev().find(|path| path.exists());
        assert_eq!(found.as_ref(), Some(&image));
        // Seen again, a path moves to the end instead of repeating; a
        // removed one is dropped.
        assert_eq!(parse(&noted(parse(&text), image.clone())), [image]);
    }

    #[test]
    fn a_note_keeps_its_newest_paths() {
        let names: Vec<String> = (0..PATHS_KEPT + 3).map(|n| format!("{n}.qcow2")).collect();
        let (_dir, paths) = images(&names.iter().map(String::as_str).collect::<Vec<_>>());
        let text = paths
            .iter()
            .fold(Vec::new(), |text, path| noted(parse(&text), path.clone()));
        assert_eq!(parse(&text), paths[3..]);
    }
}
