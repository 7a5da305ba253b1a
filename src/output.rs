//! What provm writes for the user: never seen half-written, and never in
//! place of the user's file without `--force`. Every command's outputs go
//! through `refuse_existing` (before the work starts) and `AtomicFile`
//! (which checks again when it is renamed into place).

use std::fs::File;
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{0} exists; pass --force to overwrite it, or choose another path")]
    Exists(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Refuses, before any work, the first of `outputs` that exists, unless
/// `force`.
pub fn refuse_existing<'a>(
    force: bool,
    outputs: impl IntoIterator<Item = Option<&'a Path>>,
) -> Result<(), OutputError> {
    match outputs.into_iter().flatten().find(|path| path.exists()) {
        Some(path) if !force => Err(OutputError::Exists(path.to_owned())),
        _ => Ok(()),
    }
}

/// A file written under a temporary name beside its destination
/// (`.NAME.XXXXXX.partial`, deleted if dropped unfinished) and renamed onto
/// it by `commit`. Without `force`, `commit` refuses a destination that
/// exists, even one that appeared while the file was being written.
pub struct AtomicFile {
    temp: NamedTempFile,
    path: PathBuf,
    force: bool,
}

impl AtomicFile {
    pub fn create(path: &Path, force: bool) -> Result<Self, OutputError> {
        if path.exists() && !force {
            return Err(OutputError::Exists(path.to_owned()));
        }
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            // Like any new file: 0666 less the umask (tempfile's own is 0600).
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(|source| OutputError::Io {
                path: path.to_owned(),
                source,
            })?;
        Ok(AtomicFile {
            temp,
            path: path.to_owned(),
            force,
        })
    }

    /// Where the file is while it is written (for writers that open paths).
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    pub fn file(&mut self) -> &mut File {
        self.temp.as_file_mut()
    }

    /// Writes `bytes` to `path` as one atomic file.
    pub fn write(path: &Path, force: bool, bytes: &[u8]) -> Result<PathBuf, OutputError> {
        let mut file = AtomicFile::create(path, force)?;
        std::io::Write::write_all(file.file(), bytes).map_err(|source| OutputError::Io {
            path: path.to_owned(),
            source,
        })?;
        file.commit()
    }

    /// Syncs the file and renames it onto its destination.
    pub fn commit(self) -> Result<PathBuf, OutputError> {
        let io_error = |source| OutputError::Io {
            path: self.path.clone(),
            source,
        };
        self.temp.as_file().sync_all().map_err(io_error)?;
        let persisted = match self.force {
            true => self.temp.persist(&self.path),
            false => self.temp.persist_noclobber(&self.path),
        };
        match persisted {
            Ok(_) => Ok(self.path),
            Err(error) if error.error.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(OutputError::Exists(self.path))
            }
            Err(error) => Err(io_error(error.error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn existing_outputs_are_refused_before_the_work_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let there = dir.path().join("there");
        std::fs::write(&there, "theirs").unwrap();
        let absent = dir.path().join("absent");
        let outputs = || [Some(absent.as_path()), None, Some(there.as_path())];
        assert!(matches!(
            refuse_existing(false, outputs()),
            Err(OutputError::Exists(path)) if path == there
        ));
        refuse_existing(true, outputs()).unwrap();
        refuse_existing(false, [Some(absent.as_path())]).unwrap();
    }

    #[test]
    fn an_existing_file_is_kept_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        let mut file = AtomicFile::create(&path, false).unwrap();
        file.file().write_all(b"new").unwrap();
        // Someone else wrote the destination meanwhile.
        std::fs::write(&path, "theirs").unwrap();
        assert!(matches!(file.commit(), Err(OutputError::Exists(_))));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "theirs");
        assert!(matches!(
            AtomicFile::create(&path, false),
            Err(OutputError::Exists(_))
        ));

        let mut file = AtomicFile::create(&path, true).unwrap();
        file.file().write_all(b"new").unwrap();
        file.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        // Nothing temporary is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
