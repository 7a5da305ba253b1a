//! File versions as a tracer numbers them: each path's current version,
//! the versions made so far, and what renames, links and deletions do to
//! them. The agent's in-guest tracer (guest-agent's provenance::files)
//! and the host's replay (provm's provenance::derived::versions) both
//! keep their versions here, so that the two number a job's files alike
//! and their graphs can be compared.
//!
//! How a tracer learns that a path's content changed is its own: the
//! agent reads the file on disk, a replay sees the writes go by. Each
//! keeps what it needs for that beside a path's version, as a
//! [`PathState`].
//!
//! Paths are bytes, as Linux names files and as [`FileVersion`] records
//! them: the agent reads them from its tracees as bytes, and the replay's
//! paths, which are text, convert to bytes without loss (the other way
//! would not).

use std::collections::HashMap;

use super::FileVersion;

/// A new version found by an observation, and the process that wrote it
/// (none for a file first seen, or changed by no process the tracer
/// knows: an input).
#[derive(Debug, PartialEq, Eq)]
pub struct Change {
    pub version: u32,
    pub writer: Option<u32>,
}

/// What a tracer keeps of a path beside its current version, to tell
/// when the path's content changes.
pub trait PathState: Default {
    /// The path's content is no longer what this state was following: it
    /// became a copy of another version (a rename or a link onto it), or
    /// the file is gone.
    fn replaced(&mut self);
}

#[derive(Clone, Default)]
struct Tracked<S> {
    current: Option<u32>,
    state: S,
}

/// Each path's current version and state, and every version made.
#[derive(Clone, Default)]
pub struct Versions<S> {
    paths: HashMap<Vec<u8>, Tracked<S>>,
    versions: Vec<FileVersion>,
}

impl<S: PathState> Versions<S> {
    /// The version `path` holds now, if it is known to hold one.
    pub fn current(&self, path: &[u8]) -> Option<u32> {
        self.paths.get(path)?.current
    }

    /// `path`'s state, made the first time it is asked for.
    pub fn state(&mut self, path: &[u8]) -> &mut S {
        &mut self.tracked(path).state
    }

    /// Every path's state.
    pub fn states(&self) -> impl Iterator<Item = (&[u8], &S)> {
        self.paths
            .iter()
            .map(|(path, tracked)| (path.as_slice(), &tracked.state))
    }

    /// Every path's state, to change.
    pub fn states_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.paths.values_mut().map(|tracked| &mut tracked.state)
    }

    pub fn version(&self, id: u32) -> &FileVersion {
        &self.versions[id as usize]
    }

    /// A new version of `path` with content `sha256` (empty if unknown)
    /// of `size` bytes, written by `writer`, made `path`'s current one.
    pub fn add(&mut self, path: &[u8], sha256: Vec<u8>, size: u64, writer: Option<u32>) -> Change {
        let version = self.push(path, sha256, size);
        self.tracked(path).current = Some(version);
        Change { version, writer }
    }

    /// The content of `version`, found after it was made (a replay that
    /// saw it read whole): kept unless the version has one already.
    pub fn found_content(&mut self, version: u32, sha256: Vec<u8>, size: u64) {
        let version = &mut self.versions[version as usize];
        if version.sha256.is_empty() {
            (version.sha256, version.size) = (sha256, size);
        }
    }

    /// No file is at `path` now.
    pub fn vanished(&mut self, path: &[u8]) {
        let tracked = self.tracked(path);
        tracked.current = None;
        tracked.state.replaced();
    }

    /// The file `from` was renamed to `to` (both observed just before):
    /// `to` gets a version with `from`'s content, and `from`'s state;
    /// returned with the version it came from.
    pub fn renamed(&mut self, from: &[u8], to: &[u8]) -> Option<(u32, u32)> {
        let moved = self.paths.remove(from)?;
        let source = moved.current?;
        let version = self.copy(source, to);
        let mut state = moved.state;
        state.replaced();
        let current = Some(version);
        self.paths.insert(to.to_vec(), Tracked { current, state });
        Some((version, source))
    }

    /// The directory `from` was renamed to `to`: every path under it
    /// moves, with its version and state, to the same place under `to`.
    pub fn moved_tree(&mut self, from: &[u8], to: &[u8]) {
        let under = |path: &[u8]| path.starts_with(from) && path.get(from.len()) == Some(&b'/');
        let moved: Vec<Vec<u8>> = self
            .paths
            .keys()
            .filter(|path| under(path))
            .cloned()
            .collect();
        for old in moved {
            let tracked = self.paths.remove(&old).unwrap();
            self.paths
                .insert([to, &old[from.len()..]].concat(), tracked);
        }
    }

    /// `to` is a new link to `from`'s file: a version with its content,
    /// returned with the version it came from.
    pub fn linked(&mut self, from: &[u8], to: &[u8]) -> Option<(u32, u32)> {
        let source = self.current(from)?;
        let version = self.copy(source, to);
        let tracked = self.tracked(to);
        tracked.current = Some(version);
        tracked.state.replaced();
        Some((version, source))
    }

    /// `path` was deleted: its last version, now gone.
    pub fn unlinked(&mut self, path: &[u8]) -> Option<u32> {
        self.paths.remove(path)?.current
    }

    pub fn into_versions(self) -> Vec<FileVersion> {
        self.versions
    }

    fn tracked(&mut self, path: &[u8]) -> &mut Tracked<S> {
        self.paths.entry(path.to_vec()).or_default()
    }

    /// A version of `source`'s content at `to`.
    fn copy(&mut self, source: u32, to: &[u8]) -> u32 {
        let original = &self.versions[source as usize];
        let (sha256, size) = (original.sha256.clone(), original.size);
        self.push(to, sha256, size)
    }

    fn push(&mut self, path: &[u8], sha256: Vec<u8>, size: u64) -> u32 {
        let id = self.versions.len() as u32;
        self.versions.push(FileVersion {
            id,
            path: path.to_vec(),
            sha256,
            size,
        });
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state that counts how often it was replaced.
    #[derive(Debug, Default, PartialEq)]
    struct Replacements(u32);

    impl PathState for Replacements {
        fn replaced(&mut self) {
            self.0 += 1;
        }
    }

    #[test]
    fn a_rename_carries_the_content_and_state_and_a_link_copies_the_content() {
        let mut versions = Versions::<Replacements>::default();
        let change = versions.add(b"/a", b"digest".to_vec(), 6, Some(3));
        assert_eq!(
            change,
            Change {
                version: 0,
                writer: Some(3)
            }
        );
        versions.state(b"/a").0 = 10;
        assert_eq!(versions.renamed(b"/a", b"/b"), Some((1, 0)));
        assert_eq!(versions.current(b"/a"), None);
        assert_eq!(versions.current(b"/b"), Some(1));
        assert_eq!(versions.state(b"/b"), &Replacements(11));
        assert_eq!(versions.linked(b"/b", b"/c"), Some((2, 1)));
        assert_eq!(versions.state(b"/c"), &Replacements(1));
        assert_eq!(versions.renamed(b"/none", b"/d"), None);
        assert_eq!(versions.unlinked(b"/b"), Some(1));
        assert_eq!(versions.unlinked(b"/b"), None);
        let all = versions.into_versions();
        assert_eq!(all[2].path, b"/c");
        assert_eq!((all[2].sha256.as_slice(), all[2].size), (&b"digest"[..], 6));
    }

    #[test]
    fn a_directory_moves_what_is_under_it_and_only_that() {
        let mut versions = Versions::<Replacements>::default();
        versions.add(b"/d/f", Vec::new(), 0, None);
        versions.add(b"/dx", Vec::new(), 0, None);
        versions.moved_tree(b"/d", b"/e");
        assert_eq!(versions.current(b"/e/f"), Some(0));
        assert_eq!(versions.current(b"/d/f"), None);
        assert_eq!(versions.current(b"/dx"), Some(1));
    }

    #[test]
    fn a_vanished_path_has_no_version_and_a_found_content_fills_only_a_gap() {
        let mut versions = Versions::<Replacements>::default();
        versions.add(b"/f", Vec::new(), 0, None);
        versions.add(b"/g", b"known".to_vec(), 5, None);
        versions.found_content(0, b"read".to_vec(), 4);
        versions.found_content(1, b"other".to_vec(), 5);
        versions.vanished(b"/f");
        assert_eq!(versions.current(b"/f"), None);
        assert_eq!(versions.state(b"/f"), &Replacements(1));
        assert_eq!(versions.version(0).sha256, b"read");
        assert_eq!(versions.version(1).sha256, b"known");
    }
}
