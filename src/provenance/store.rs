//! A run's provenance on disk (`provm run --prov FILE`), and the digests
//! of what crossed the VM's boundary.

use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use provm_engine::digest::HashingWriter;
use provm_trace::reader::Trace;

use super::capture::Boundary;
use super::model::Provenance;
use super::ProvenanceError;

/// Marks provm's provenance documents; a change of the model bumps VERSION.
const FORMAT: &str = "provm-provenance";
const VERSION: u32 = 1;

#[derive(Serialize)]
struct Stored<'a> {
    format: &'a str,
    version: u32,
    provenance: &'a Provenance,
}

#[derive(Deserialize)]
struct Loaded {
    format: String,
    version: u32,
    provenance: Option<Provenance>,
}

impl Provenance {
    pub fn to_bytes(&self) -> Vec<u8> {
        let stored = Stored {
            format: FORMAT,
            version: VERSION,
            provenance: self,
        };
        serde_json::to_vec(&stored).expect("the model serialises")
    }

    /// The document in `bytes`; `path` names them in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Provenance, ProvenanceError> {
        let not_provenance = || ProvenanceError::NotProvenance {
            path: path.to_owned(),
        };
        let loaded: Loaded = serde_json::from_slice(bytes).map_err(|_| not_provenance())?;
        if loaded.format != FORMAT {
            return Err(not_provenance());
        }
        if loaded.version != VERSION {
            return Err(ProvenanceError::Version {
                path: path.to_owned(),
                found: loaded.version,
                expected: VERSION,
            });
        }
        loaded.provenance.ok_or_else(not_provenance)
    }
}

/// The provenance stored at `path` (what `provm graph RUN` reads): a
/// document `--prov` wrote, or the one inside a trace.
pub fn load(path: &Path) -> Result<Provenance, ProvenanceError> {
    let bytes = std::fs::read(path).map_err(|source| ProvenanceError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !bytes.starts_with(provm_trace::format::MAGIC) {
        return Provenance::from_bytes(&bytes, path);
    }
    let trace = Trace::open(path).map_err(|error| ProvenanceError::Trace(error.to_string()))?;
    let embedded = trace
        .provenance
        .ok_or_else(|| ProvenanceError::NotInTrace {
            path: path.to_owned(),
        })?;
    Provenance::from_bytes(&embedded, path)
}

pub fn save(document: &Provenance, path: &Path) -> Result<(), ProvenanceError> {
    std::fs::write(path, document.to_bytes()).map_err(|source| ProvenanceError::Io {
        path: path.to_owned(),
        source,
    })
}

/// A short text the VM was given (the command line), by content.
pub fn text_boundary(name: &str, lines: Vec<String>) -> Boundary {
    let mut hasher = HashingWriter::new(io::sink());
    for line in &lines {
        let _ = writeln!(hasher, "{line}");
    }
    Boundary::passed(name, hasher.digested(), lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_round_trip_and_other_files_are_refused() {
        let path = Path::new("run.prov");
        let document = Provenance::default();
        let bytes = document.to_bytes();
        assert_eq!(Provenance::from_bytes(&bytes, path).unwrap(), document);
        for other in [&b"QFI\xfb"[..], b"{}", br#"{"format":"x","version":1}"#] {
            assert!(matches!(
                Provenance::from_bytes(other, path),
                Err(ProvenanceError::NotProvenance { .. })
            ));
        }
        let future = br#"{"format":"provm-provenance","version":99}"#;
        assert!(matches!(
            Provenance::from_bytes(future, path),
            Err(ProvenanceError::Version { found: 99, .. })
        ));
    }

    #[test]
    fn hashing_writers_pass_bytes_on() {
        let mut passed = Vec::new();
        let mut writer = HashingWriter::new(&mut passed);
        writer.write_all(b"abc").unwrap();
        let boundary = Boundary::passed("stdout", writer.digested(), Vec::new());
        assert_eq!(passed, b"abc");
        assert_eq!(boundary.size, 3);
        assert!(boundary.sha256.starts_with("ba7816bf"));
    }
}
