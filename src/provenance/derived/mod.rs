//! Provenance derived at replay: `provm graph` on a trace recorded without
//! `--prov` replays it with the `provenance` analysis (`analysis.rs`, the
//! one `--analyze provenance` runs; file versions as a replay sees them in
//! `versions.rs`) and builds the same document from its records.

mod analysis;
mod versions;

use provm_trace::reader::Trace;

pub use analysis::DerivedProvenance;

use super::{build, text_boundary, Provenance, ProvenanceError, VmBoundary};
use provm_engine::replay::{self, ReplayOptions};

/// The provenance of the run `replay` names: the document `--prov` wrote,
/// or the trace's embedded one, else (or with `from_replay`) the one
/// derived from a replay of the trace.
pub fn load_or_derive(
    replay: &ReplayOptions,
    from_replay: bool,
) -> Result<Provenance, ProvenanceError> {
    if !provm_trace::format::starts_as_trace(&replay.trace) {
        return super::load(&replay.trace);
    }
    let trace = Trace::open(&replay.trace).map_err(|e| ProvenanceError::Trace(e.to_string()))?;
    of_trace(&trace, replay, from_replay)
}

/// The provenance of `trace` (opened from `replay.trace`): embedded, else
/// (or with `from_replay`) derived from a replay of it.
pub fn of_trace(
    trace: &Trace,
    replay: &ReplayOptions,
    from_replay: bool,
) -> Result<Provenance, ProvenanceError> {
    match &trace.provenance {
        Some(embedded) if !from_replay => Provenance::from_bytes(embedded, &replay.trace),
        embedded => {
            if embedded.is_none() {
                eprintln!(
                    "provm: {} was recorded without --prov; deriving its provenance from its system calls by replaying it",
                    replay.trace.display()
                );
            }
            from_replay_of(trace, replay)
        }
    }
}

/// The provenance of the trace `options` names, from a replay of it.
fn from_replay_of(trace: &Trace, options: &ReplayOptions) -> Result<Provenance, ProvenanceError> {
    let (report, derived) = replay::replay_with(options, DerivedProvenance::default())
        .map_err(|e| ProvenanceError::Trace(e.to_string()))?;
    report.analysable().map_err(ProvenanceError::Diverged)?;
    let manifest = &trace.manifest;
    let start_ns = manifest.started_unix * 1_000_000_000;
    let records = derived.records(start_ns);
    let vm = VmBoundary {
        inputs: super::trace_inputs(manifest)
            .into_iter()
            .chain([text_boundary("command", manifest.argv.clone())])
            .collect(),
        outputs: Vec::new(),
        start_ns,
        end_ns: start_ns + trace.outcome.guest_ns,
    };
    Ok(build(&records, &vm))
}
