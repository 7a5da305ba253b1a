//! Files in provm's cache that hold one checksummed section, as a trace
//! does: the booted guest's snapshot (`fast_start`), and the kernel and
//! the initramfs compressed as traces embed them (`record`). Written
//! atomically, verified on read; an unreadable one is said and made again.

use std::path::Path;

use provm_trace::format::{FormatError, SectionHeader, SectionKind, SectionWriter, TraceReader};

/// The section of kind `kind` cached at `path`, verified by its checksum;
/// `None` if there is none, or it cannot be read (said as a warning).
pub fn read(path: &Path, kind: SectionKind) -> Option<Vec<u8>> {
    if !path.exists() {
        return None;
    }
    let section = TraceReader::open(path).and_then(|mut reader| reader.next_section());
    match section {
        Ok(Some(section)) if section.kind == kind => Some(section.payload),
        Ok(_) => {
            tracing::warn!("ignoring {}: it holds no {kind:?} section", path.display());
            None
        }
        Err(error) => {
            tracing::warn!("ignoring the unreadable {}: {error}", path.display());
            None
        }
    }
}

/// The header of the section cached at `path` (its kind, length and
/// checksum), its payload unread; `None` if there is none.
pub fn header(path: &Path) -> Option<SectionHeader> {
    TraceReader::open(path).ok()?.next_header().ok()?
}

/// Caches `bytes` at `path` as one section of kind `kind`.
pub fn write(path: &Path, kind: SectionKind, bytes: &[u8]) -> Result<(), FormatError> {
    std::fs::create_dir_all(path.parent().expect("in the cache directory"))
        .map_err(FormatError::Write)?;
    let mut cache = SectionWriter::create(path)?;
    cache.section(kind, bytes)?;
    cache.finish().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_section_reads_back_and_a_damaged_or_other_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deeper").join("kernel.zstd9");
        assert_eq!(read(&path, SectionKind::Kernel), None);
        write(&path, SectionKind::Kernel, b"compressed kernel").unwrap();
        assert_eq!(
            read(&path, SectionKind::Kernel).as_deref(),
            Some(&b"compressed kernel"[..])
        );
        assert_eq!(read(&path, SectionKind::Snapshot), None, "another kind");

        let mut bytes = std::fs::read(&path).unwrap();
        let payload = bytes
            .windows(10)
            .position(|window| window == b"compressed")
            .unwrap();
        bytes[payload] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(read(&path, SectionKind::Kernel), None, "damaged");
    }
}
