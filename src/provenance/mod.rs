//! Provenance graphs: which processes of a run read and wrote which files,
//! from which inputs. The guest agent captures them (guest-agent's
//! provenance module); this side builds the PROV-DM document, stores it,
//! and exports PROV-JSON, DOT and SVG (`provm graph`).

mod capture;
mod derived;
mod dot;
mod files;
mod inputs;
mod model;
mod noise;
mod prov_json;
mod query;
mod record;
mod runs;
mod store;

use std::path::PathBuf;

pub use capture::{build, Boundary, VmBoundary};
pub use derived::{load_or_derive, of_trace, DerivedProvenance};
pub use files::{inputs as input_files, outputs as output_files, Output};
pub use inputs::{of_machine as machine_inputs, of_trace as trace_inputs};
pub use model::{Activity, Entity, EntityKind, Provenance, Relation, EMPTY_SHA256, VM_ACTIVITY};
pub use noise::noise_kind;
pub use prov_json::NAMESPACE;
pub use query::{lineage, Direction};
pub use record::ProvenanceCapture;
pub use runs::{combine, NamedRun};
pub use store::{load, save, text_boundary};

#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} holds no provenance; record a run's with: provm run --prov {path} IMAGE -- CMD"
    )]
    NotProvenance { path: PathBuf },
    #[error(
        "{path} holds provenance of format version {found}; this provm reads version {expected}"
    )]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("the run recorded no processes (did its command start?)")]
    Empty,
    #[error("{0}")]
    Trace(String),
    #[error("cannot identify the VM's inputs: {0}")]
    Input(String),
    #[error("the trace {path} was recorded without provenance; record with: provm record --prov FILE IMAGE -- CMD")]
    NotInTrace { path: PathBuf },
    #[error("the replay diverged, so a graph derived from it would not be the run's: {0}")]
    Diverged(String),
    #[error("the run never touched {path}{}", similar_paths(.similar))]
    NotTouched { path: String, similar: Vec<String> },
    #[error(
        "cannot run graphviz's `dot` for SVG ({0}); install it with: apt-get install graphviz"
    )]
    Graphviz(std::io::Error),
    #[error("graphviz's `dot` failed: {0}")]
    GraphvizFailed(String),
}

fn similar_paths(similar: &[String]) -> String {
    if similar.is_empty() {
        String::new()
    } else {
        format!(" (it touched {})", similar.join(", "))
    }
}

/// What `provm graph` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// W3C PROV-JSON, complete.
    ProvJson,
    /// Graphviz DOT, with noise collapsed.
    Dot,
    /// SVG drawn by graphviz from the DOT.
    Svg,
}

/// `document` in `format`.
pub fn render(document: &Provenance, format: Format) -> Result<Vec<u8>, ProvenanceError> {
    Ok(match format {
        Format::ProvJson => {
            let mut json = serde_json::to_vec_pretty(&prov_json::export(document))
                .expect("a JSON value serialises");
            json.push(b'\n');
            json
        }
        Format::Dot => dot::export(document).into_bytes(),
        Format::Svg => dot::svg(document)?,
    })
}
