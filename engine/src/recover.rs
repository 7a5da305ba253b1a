//! A trace from what a killed recording left behind: the unfinished file
//! its writer keeps beside the trace's path (`.NAME.XXXXXX.partial`, see
//! `provm_trace::format::SectionWriter`) until it renames it into place. A
//! recording killed with SIGKILL (a container engine's time limit, a node
//! lost) never gets there. Its leading sections and every event chunk
//! written whole are kept, the torn chunk after them is not; the result is
//! an ordinary trace cut short, as a timed-out recording's is, which
//! replays up to its last kept event. A run that had finished (its outcome
//! written) keeps its outcome, and the sections after it that are whole.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use provm_trace::event_log::{EventLogWriter, EventStream};
use provm_trace::events::Event;
use provm_trace::format::{FormatError, SectionKind, TraceReader};
use provm_trace::manifest::{Manifest, Outcome};
use provm_trace::reader::Trace;
use provm_trace::snapshot::SnapshotError;
use provm_trace::writer::{Ending, Leading, TraceWriter};

/// What the recovered trace holds.
#[derive(Debug)]
pub struct Recovered {
    pub trace: PathBuf,
    pub events: u64,
    /// Whether the run had finished (its outcome was written).
    pub finished: bool,
    /// Why reading stopped before the end of the file: the torn part.
    pub torn: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("{0}")]
    Format(#[from] FormatError),
    #[error("{0}: the recording was killed before its trace's first sections were written whole ({1}): there is nothing to replay")]
    NoStart(PathBuf, String),
    #[error("{0}: the booted guest's snapshot in it cannot be read: {1}")]
    Snapshot(PathBuf, SnapshotError),
    #[error("cannot remove {path} once recovered: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The trace `partial` would have become: `.NAME.XXXXXX.partial` -> NAME,
/// beside it.
pub fn default_output(partial: &Path) -> Option<PathBuf> {
    let name = partial.file_name()?.to_str()?;
    let inner = name.strip_prefix('.')?.strip_suffix(".partial")?;
    let (trace, _random) = inner.rsplit_once('.')?;
    (!trace.is_empty()).then(|| partial.with_file_name(trace))
}

/// The unfinished files a recording of `trace` left beside it, newest
/// first.
pub fn partials_of(trace: &Path) -> Vec<PathBuf> {
    let dir = match trace.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut partials: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| default_output(path).as_deref() == Some(trace))
        .map(|path| {
            let modified = std::fs::metadata(&path).and_then(|m| m.modified());
            (modified.unwrap_or(SystemTime::UNIX_EPOCH), path)
        })
        .collect();
    partials.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    partials.into_iter().map(|(_, path)| path).collect()
}

/// Writes the trace at `out` from the unfinished `partial`, reads it back
/// whole, and only then removes `partial`.
pub fn recover(partial: &Path, out: &Path) -> Result<Recovered, RecoverError> {
    let recovered = write_recovered(partial, out)?;
    Trace::open(&recovered.trace)?;
    std::fs::remove_file(partial).map_err(|source| RecoverError::Remove {
        path: partial.into(),
        source,
    })?;
    Ok(recovered)
}

fn write_recovered(partial: &Path, out: &Path) -> Result<Recovered, RecoverError> {
    let no_start = |error: FormatError| RecoverError::NoStart(partial.into(), error.to_string());
    let manifest = manifest(partial).map_err(no_start)?;
    let leading = Leading::of_trace(partial, manifest).map_err(no_start)?;
    if leading.snapshot.is_empty() {
        return Err(RecoverError::NoStart(
            partial.into(),
            "no snapshot section".into(),
        ));
    }
    let start_ns = crate::snapshot::state(&leading.snapshot, leading.manifest.machine_version)
        .map_err(|error| RecoverError::Snapshot(partial.into(), error))?
        .clock_ns;

    let mut log = EventLogWriter::new(
        TraceWriter::create(out, &leading)?.into_sections(),
        start_ns,
    );
    let mut events = EventStream::open(partial)?;
    let (mut disk_writes, mut torn) = (0, None);
    loop {
        match events.next_event() {
            Ok(Some(event)) => {
                disk_writes += u64::from(matches!(event, Event::DiskWrite { .. }));
                log.append(&event)?;
            }
            Ok(None) => break,
            Err(error) => {
                torn = Some(error.to_string());
                break;
            }
        }
    }
    let events = log.events();
    let (sections, totals) = log.finish()?;
    let sections = sections.expect("the log writes to the recovered trace");

    let (finished, after) = match torn {
        Some(_) => (None, Vec::new()),
        None => finished_run(partial)?,
    };
    let outcome = match finished {
        // Chunked again as the recording chunked it; counted all the same.
        Some(outcome) => Outcome {
            event_chunks: totals.chunks,
            ..outcome
        },
        None => {
            let ending = Ending {
                complete: false,
                ended: format!(
                    "the recording process was killed before it finished; recovered from {} ({events} events written whole)",
                    partial.display()
                ),
                exit_status: None,
            };
            let mut outcome = Outcome::of_log(
                ending,
                &totals,
                start_ns,
                recording_seconds(partial),
                String::new(),
            );
            // The log keeps each write's digest, not its bytes: the count is
            // known, the digest over the bytes is not (a replay of a run cut
            // short does not compare it).
            outcome.disk_writes = disk_writes;
            outcome.disk_writes_sha256 = String::new();
            outcome
        }
    };
    let finished = outcome.complete;
    let trace = TraceWriter::finish(sections, outcome, &after)?;
    Ok(Recovered {
        trace,
        events,
        finished,
        torn,
    })
}

fn manifest(partial: &Path) -> Result<Manifest, FormatError> {
    let mut reader = TraceReader::open(partial)?;
    let first = reader
        .next_section()?
        .filter(|section| section.kind == SectionKind::Manifest)
        .ok_or_else(|| FormatError::Decode {
            index: 0,
            kind: "manifest",
            reason: "the file does not start with a manifest".into(),
        })?;
    serde_json::from_slice(&first.payload).map_err(|error| first.decode_error(error))
}

/// The outcome of a run whose log ended at it, and the sections after it
/// that are whole; none if the log ended at the end of the file.
type Finished = (Option<Outcome>, Vec<(SectionKind, Vec<u8>)>);

fn finished_run(partial: &Path) -> Result<Finished, FormatError> {
    let mut reader = TraceReader::open(partial)?;
    let mut outcome = None;
    let mut after = Vec::new();
    while let Ok(Some(header)) = reader.next_header() {
        if outcome.is_none() {
            if header.kind == SectionKind::Outcome {
                let section = reader.read_payload(header)?;
                outcome = Some(
                    serde_json::from_slice::<Outcome>(&section.payload)
                        .map_err(|error| section.decode_error(error))?,
                );
            }
            continue;
        }
        match reader.read_payload(header) {
            Ok(section) => after.push((section.kind, section.payload)),
            Err(_) => break,
        }
    }
    Ok((outcome, after))
}

/// How long the recording wrote its file, as far as the file system says:
/// from its creation to its last write (0 where creation is not kept).
fn recording_seconds(partial: &Path) -> f64 {
    let Ok(metadata) = std::fs::metadata(partial) else {
        return 0.0;
    };
    let span = |created: SystemTime, modified: SystemTime| modified.duration_since(created).ok();
    metadata
        .created()
        .ok()
        .zip(metadata.modified().ok())
        .and_then(|(created, modified)| span(created, modified))
        .map_or(0.0, |span| span.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partial_file_names_the_trace_it_would_have_become() {
        assert_eq!(
            default_output(Path::new("/t/.run.provm.Ab12Cd.partial")),
            Some(PathBuf::from("/t/run.provm"))
        );
        assert_eq!(
            default_output(Path::new(".a.b.provm.x.partial")),
            Some(PathBuf::from("a.b.provm"))
        );
        for not_partial in ["/t/run.provm", "/t/.x.partial", "/t/run.provm.partial"] {
            assert_eq!(
                default_output(Path::new(not_partial)),
                None,
                "{not_partial}"
            );
        }
    }
}
