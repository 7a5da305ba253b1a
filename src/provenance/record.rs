//! `--prov`: the provenance of the job a run or a recording runs, captured
//! as the engine runs it (an `Observer`), saved to its file, and kept in a
//! recording's trace.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use provm_engine::digest::bytes_sha256;
use provm_engine::host_paths::HostPaths;
use provm_engine::machine::Prepared;
use provm_engine::observer::JobOutput;
use provm_engine::observer::{Observer, ObserverError};
use provm_engine::pinning::Pinning;
use provm_engine::session::GuestSession;
use provm_engine::utc;
use provm_guest_agent::Job;
use provm_trace::format::SectionKind;

use super::{build, machine_inputs, save, text_boundary, Boundary, Provenance, VmBoundary};

/// Captures the provenance of the job it observes: the machine's inputs
/// (its image, kernel and initramfs, see `inputs`), the command, its
/// entropy and clock (`pinned`, or the host's), and what the agent saw.
pub struct ProvenanceCapture {
    /// Where the document is saved (`--prov FILE`), if anywhere.
    path: Option<PathBuf>,
    pinned: Option<Pinning>,
    host_paths: HostPaths,
    inputs: Vec<Boundary>,
    start_ns: u64,
    document: Option<Provenance>,
}

impl ProvenanceCapture {
    pub fn new(path: Option<PathBuf>, pinned: Option<Pinning>, host_paths: HostPaths) -> Self {
        ProvenanceCapture {
            path,
            pinned,
            host_paths,
            inputs: Vec::new(),
            start_ns: 0,
            document: None,
        }
    }

    /// The document, once the job has ended.
    pub fn into_document(self) -> Option<Provenance> {
        self.document
    }
}

impl Observer for ProvenanceCapture {
    fn job_starting(&mut self, job: &mut Job, prepared: &Prepared) -> Result<(), ObserverError> {
        job.provenance = true;
        self.start_ns = now_ns();
        let text = |items: &[Vec<u8>]| {
            items
                .iter()
                .map(|item| String::from_utf8_lossy(item).into_owned())
                .collect()
        };
        self.inputs = machine_inputs(prepared, self.host_paths)?;
        let pinned = self.pinned.as_ref();
        self.inputs.extend([
            text_boundary("command", text(&job.argv)),
            // The seed's digest, not the seed: a graph may be shared.
            text_boundary(
                "entropy",
                vec![format!(
                    "{} bytes {}, sha256 {}",
                    job.entropy.len(),
                    match pinned {
                        Some(pinning) => format!("from --seed {}", pinning.seed_hex()),
                        None => "from the host".into(),
                    },
                    bytes_sha256(&job.entropy)
                )],
            ),
            text_boundary(
                "clock",
                vec![match pinned {
                    Some(pinning) => format!(
                        "logical time from {} (--pinned): {} ns per VM exit, and to the next timer deadline when the guest halts",
                        utc::date_time(pinning.epoch_ns / 1_000_000_000),
                        pinning.exit_step_ns
                    ),
                    None => "host time, read by the guest through the PIT and CMOS (logged in the trace when recording)".into(),
                }],
            ),
        ]);
        Ok(())
    }

    fn job_ended(
        &mut self,
        session: &mut GuestSession,
        output: &JobOutput,
    ) -> Result<(), ObserverError> {
        let vm = VmBoundary {
            inputs: std::mem::take(&mut self.inputs),
            outputs: vec![
                Boundary::passed("stdout", output.stdout.clone(), Vec::new()),
                Boundary::passed("stderr", output.stderr.clone(), Vec::new()),
            ],
            start_ns: self.start_ns,
            end_ns: now_ns(),
        };
        let document = build(&session.take_provenance(), &vm);
        if let Some(path) = &self.path {
            save(&document, path)?;
        }
        self.document = Some(document);
        Ok(())
    }

    fn section(&mut self) -> Result<Option<(SectionKind, Vec<u8>)>, ObserverError> {
        Ok(self
            .document
            .as_ref()
            .map(|document| (SectionKind::Provenance, document.to_bytes())))
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}
