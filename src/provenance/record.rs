//! `--prov`: one job run with capture on, and its provenance document.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use provm_guest_agent::{Job, Outcome};

use super::{build, text_boundary, Boundary, HashingWriter, Provenance, VmBoundary};
use crate::pinning::Pinning;
use crate::run::RunError;
use crate::session::GuestSession;

/// Runs `job` (which asks for capture) in `session`, whose machine read
/// `machine_inputs` (its image, kernel and initramfs, see `inputs`), with
/// its clock and entropy `pinned`, or the host's; returns how it ended and
/// its provenance.
pub fn run_captured(
    session: &mut GuestSession,
    job: Job,
    machine_inputs: Vec<Boundary>,
    pinned: Option<&Pinning>,
    (stdout, stderr): (&mut dyn Write, &mut dyn Write),
) -> Result<(Outcome, Provenance), RunError> {
    let start_ns = now_ns();
    let text = |items: &[Vec<u8>]| {
        items
            .iter()
            .map(|item| String::from_utf8_lossy(item).into_owned())
            .collect()
    };
    let mut inputs = machine_inputs;
    inputs.extend([
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
                crate::digest::bytes_sha256(&job.entropy)
            )],
        ),
        text_boundary(
            "clock",
            vec![match pinned {
                Some(pinning) => format!(
                    "logical time from {} (--pinned): {} ns per VM exit, and to the next timer deadline when the guest halts",
                    crate::record::utc_date_time(pinning.epoch_ns / 1_000_000_000),
                    pinning.exit_step_ns
                ),
                None => "host time, read by the guest through the PIT and CMOS (logged in the trace when recording)".into(),
            }],
        ),
    ]);
    let (mut out, mut err) = (HashingWriter::new(stdout), HashingWriter::new(stderr));
    let outcome = session.run(job, &mut out, &mut err)?;
    let vm = VmBoundary {
        inputs,
        outputs: vec![
            out.boundary("stdout", Vec::new()),
            err.boundary("stderr", Vec::new()),
        ],
        start_ns,
        end_ns: now_ns(),
    };
    Ok((outcome, build(&session.take_provenance(), &vm)))
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}
