//! `provm replay RUN --fork-at POINT --inject FAULT -o FORK`: a what-if
//! fork of a replay. The trace is replayed exactly up to the fork point;
//! there the same VM goes on live, driven by a recorder, with the fault
//! injected at the VM boundary; the fork is compared with the recording
//! and written as a trace of its own.
//!
//! The fork's trace starts from the recording's own snapshot and image,
//! and its log is the recording's up to the fork point followed by the
//! fork's: the guest's memory, its devices, the agent channel, the clock
//! and the disk overlay at the fork point are whatever the replay made
//! them, and a replay of the fork rebuilds them the same way (checked, as
//! every replay is, by every event and the digest of all disk writes).
//! Nothing at the fork point needs capturing, and the fork's trace is an
//! ordinary one; a replay of it re-executes the recording's part too.

mod compare;
mod fault;
mod log;
mod seam;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use provm_guest_agent::{HostMessage, Job};
use provm_trace::event_log::EventLogWriter;
use provm_trace::format::{FormatError, SectionKind, TraceReader};
use provm_trace::manifest::{ForkOrigin, Outcome};
use provm_trace::writer::{Ending, Leading, TraceWriter};
use provm_vmm::vm::{Vm, VmError, VmEvent};

pub use compare::{Comparison, Verdict};
pub use fault::{Fault, FaultError, ForkPoint};
use log::LogSummary;
use seam::{ForkSeam, LiveClock, Trigger, AT_FORK_POINT};

use provm_engine::host_paths;
use provm_engine::pinning::{self, Pinning};
use provm_engine::replay::{Opened, ReplayError, ReplayOptions};

use crate::agent_outputs::AgentOutputs;

pub struct ForkOptions {
    pub replay: ReplayOptions,
    pub at: ForkPoint,
    pub fault: Fault,
    pub output: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error("cannot read the trace: {0}")]
    Read(FormatError),
    #[error("cannot write the fork's trace {path}: {source}")]
    Write { path: PathBuf, source: FormatError },
    #[error("the fork point event {at} is past the end of the trace, which has {events} events (0 to {last}); choose one before its end", last = .events.saturating_sub(1))]
    PastTheEnd { at: u64, events: u64 },
    #[error("the trace has {writes} disk writes, so there is no disk-write:{nth}")]
    NoSuchWrite { nth: u64, writes: u64 },
    #[error("the trace has no job (the host never sent a command): nothing to fork")]
    NoJob,
    #[error("{fault} needs a fork point at or before event {job}, where the command is sent: the guest takes its entropy with the command")]
    EntropyAfterJob { fault: Fault, job: u64 },
    #[error("{fault} after the command was sent (event {job}) would move the guest's clock back, which a clock never does; fork at or before event {job} to start the command at an earlier time")]
    ClockBack { fault: Fault, job: u64 },
    #[error("this trace is a fork that injected a disk error already: fork it with another fault, or fork the recording it came from")]
    SecondDiskError,
    #[error("the replay diverged before the fork point, so there is nothing to fork from:\n{0}")]
    Diverged(String),
    #[error("the replay reached the end of the trace before the fork point: it makes fewer disk reads than that disk-read:N asks for")]
    NeverForked,
    #[error("cannot write the fork's trace {path}: {error}")]
    Log { path: PathBuf, error: String },
    #[error(transparent)]
    Vm(#[from] VmError),
}

impl ForkError {
    /// Whether the fork itself failed (it could not write its trace), as
    /// opposed to the trace, the request or the replay: a tool failure.
    pub fn is_tool_failure(&self) -> bool {
        matches!(self, ForkError::Write { .. } | ForkError::Log { .. })
    }
}

/// A finished fork.
pub struct Forked {
    pub comparison: Comparison,
    pub fork_event: u64,
    pub trace: PathBuf,
    pub events_sha256: String,
}

/// How the fork's live part ended.
enum LiveEnd {
    /// The guest powered off after the command finished.
    PoweredOff,
    /// Anything else: a guest panic or reset, a halt, a VM failure.
    Failed(String),
}

/// `provm replay --fork-at`: forks, prints the comparison, and exits 0
/// whatever the verdict (the fork itself worked).
pub fn run(options: &ForkOptions) -> Result<std::process::ExitCode, ForkError> {
    eprintln!(
        "provm: replaying {} to {}, then live with {}",
        options.replay.trace.display(),
        options.at,
        options.fault
    );
    let forked = fork(options)?;
    println!(
        "fork of {} at event {} ({}), fault {}",
        options.replay.trace.display(),
        forked.fork_event,
        options.at,
        options.fault
    );
    print!("{}", forked.comparison);
    eprintln!(
        "provm: wrote the fork's trace {} (event log sha256 {}); `provm replay` replays it",
        forked.trace.display(),
        forked.events_sha256
    );
    Ok(std::process::ExitCode::SUCCESS)
}

pub fn fork(options: &ForkOptions) -> Result<Forked, ForkError> {
    let (opened, snapshot) = Opened::open(&options.replay)?;
    let trace = &opened.trace;
    let summary = LogSummary::read(trace).map_err(ForkError::Read)?;
    let (job_event, job) = summary.job.clone().ok_or(ForkError::NoJob)?;
    let trigger = trigger(options.at, &summary)?;
    // Whether the host sends the command in the live part.
    let job_live = match trigger {
        Trigger::Event(at) => at <= job_event,
        Trigger::DiskRead(_) => false,
    };
    let (job, jump_ns) = apply_fault(&options.fault, job, job_live, job_event)?;
    if options.fault == Fault::DiskError && trace.outcome.disk_error_access.is_some() {
        // Its trace could name one failed disk access only.
        return Err(ForkError::SecondDiskError);
    }

    let write_error = |source| ForkError::Write {
        path: options.output.clone(),
        source,
    };
    let mut manifest = trace.manifest.clone();
    manifest.fork = Some(ForkOrigin {
        // A fork is published like any trace: no host paths.
        trace: host_paths::file_name(&options.replay.trace),
        events_sha256: trace.outcome.events_sha256.clone(),
        at: options.at.to_string(),
        fault: options.fault.to_string(),
    });
    let start_ns = opened.start_ns;
    let replayer = opened.replayer()?;
    let clock = LiveClock {
        snapshot_ns: start_ns,
        wall_at_snapshot_ns: job.wall_clock_ns,
        jump_ns,
    };
    let leading = Leading::of_trace(&options.replay.trace, manifest).map_err(ForkError::Read)?;
    let writer = TraceWriter::create(&options.output, &leading).map_err(write_error)?;
    let seam = ForkSeam::new(
        replayer,
        EventLogWriter::new(writer.into_sections(), start_ns),
        start_ns,
        trigger,
        options.fault == Fault::DiskError,
        clock,
    );
    let (mut vm, seam) = opened
        .machine(options.replay.echo_console)
        .restore(snapshot, |_| seam)
        .map_err(ReplayError::from)?;

    let started = Instant::now();
    let deadline = started + options.replay.timeout;
    let mut outputs = AgentOutputs::default();
    let end = drive(&mut vm, &seam, &job, &summary.data, &mut outputs, deadline)
        .map_err(|error| fork_failure(error, seam.log_error(), &options.output));
    let console_tail = vm.console_tail(25);
    drop(vm);
    let end = end?;
    let fork_event = seam.fork_event().expect("the fork went live");
    let (writer, totals) = seam.finish().map_err(write_error)?;
    let writer = writer.expect("the fork's log goes to its trace");

    let outcome = Outcome {
        fork_event: Some(fork_event),
        disk_error_access: seam.failed_disk_access(),
        // Its replayed part says nothing of the recording's exitless
        // stretches: `longest_exitless_seconds` stays unset.
        ..Outcome::of_log(
            ending(&end, &outputs),
            &totals,
            start_ns,
            started.elapsed().as_secs_f64(),
            console_tail,
        )
    };
    // The recording's embedded disks, which the fork's guest read too.
    let mut after = Vec::new();
    for (kind, held) in [
        (SectionKind::InputDisk, trace.has_input_disk),
        (SectionKind::Image, trace.has_image),
    ] {
        if held {
            let payload = recorded_section(&options.replay.trace, kind).map_err(ForkError::Read)?;
            after.push((kind, payload));
        }
    }
    let path = TraceWriter::finish(writer, outcome, &after).map_err(write_error)?;
    let failure = match &end {
        LiveEnd::PoweredOff => None,
        LiveEnd::Failed(why) => Some(why.clone()),
    };
    Ok(Forked {
        comparison: Comparison::new(&summary, &trace.outcome, &outputs, &totals, failure),
        fork_event,
        trace: path,
        events_sha256: totals.events_sha256,
    })
}

/// Where the live part starts, checked against the log.
fn trigger(at: ForkPoint, summary: &LogSummary) -> Result<Trigger, ForkError> {
    match at {
        ForkPoint::Event(at) if at >= summary.events => Err(ForkError::PastTheEnd {
            at,
            events: summary.events,
        }),
        ForkPoint::Event(at) => Ok(Trigger::Event(at)),
        ForkPoint::DiskWrite(nth) => summary
            .disk_write_exits
            .get(nth as usize - 1)
            .map(|&exit| Trigger::Event(exit))
            .ok_or(ForkError::NoSuchWrite {
                nth,
                writes: summary.disk_write_exits.len() as u64,
            }),
        ForkPoint::DiskRead(nth) => Ok(Trigger::DiskRead(nth)),
    }
}

/// The job the live part sends (if it sends it) with the fault applied,
/// and how far the VMM's clock jumps at the fork point.
fn apply_fault(
    fault: &Fault,
    mut job: Job,
    job_live: bool,
    job_event: u64,
) -> Result<(Job, u64), ForkError> {
    match fault {
        Fault::None | Fault::DiskError => Ok((job, 0)),
        // The guest sets its clock from the command's: shifting that moves
        // its wall clock alone, as running the command later would.
        Fault::Clock { shift_ns } if job_live => {
            job.wall_clock_ns = job.wall_clock_ns.saturating_add_signed(*shift_ns);
            Ok((job, 0))
        }
        // Once set, the guest's clock follows the VMM's, which jumps.
        Fault::Clock { shift_ns } => {
            u64::try_from(*shift_ns)
                .map(|jump| (job, jump))
                .map_err(|_| ForkError::ClockBack {
                    fault: fault.clone(),
                    job: job_event,
                })
        }
        Fault::Entropy { seed } if job_live => {
            let seed = pinning::parse_seed(seed).expect("checked when parsed");
            job.entropy = Pinning {
                seed,
                ..Pinning::default()
            }
            .entropy();
            Ok((job, 0))
        }
        Fault::Entropy { .. } => Err(ForkError::EntropyAfterJob {
            fault: fault.clone(),
            job: job_event,
        }),
    }
}

/// Runs the fork: the replay to the fork point, then the live part to the
/// guest's power-off, sending what the host sends when it is live.
fn drive(
    vm: &mut Vm,
    seam: &Arc<ForkSeam>,
    job: &Job,
    data: &[Vec<u8>],
    outputs: &mut AgentOutputs,
    deadline: Instant,
) -> Result<LiveEnd, ForkError> {
    let replayer = seam.replayer();
    let (mut job_sent, mut power_off_sent) = (false, false);
    let mut data_sent = 0;
    let started = Instant::now();
    let mut announced = false;
    // Said once, where the driver first sees the fork live.
    let mut announce = |live: bool| {
        if live && !std::mem::replace(&mut announced, true) {
            eprintln!(
                "provm: reached the fork point, event {}, in {:.2} s; going on live",
                seam.fork_event().expect("live"),
                started.elapsed().as_secs_f64()
            );
        }
    };
    loop {
        let live = seam.go_live_if_due();
        announce(live);
        if live {
            if !job_sent {
                vm.send_to_agent(&HostMessage::Run(job.clone()).encode());
                job_sent = true;
            }
            // The job's data the replayed part had not sent, all at once.
            for bytes in &data[data_sent..] {
                vm.send_to_agent(bytes);
            }
            data_sent = data.len();
            if outputs.finished.is_some() && !power_off_sent {
                vm.send_to_agent(&HostMessage::PowerOff.encode());
                power_off_sent = true;
            }
        } else {
            while let Some(bytes) = replayer.pending_agent_input() {
                match HostMessage::of_frame(&bytes) {
                    Some(HostMessage::Run(_)) => job_sent = true,
                    Some(HostMessage::PowerOff) => power_off_sent = true,
                    Some(message) if message.is_data() => data_sent += 1,
                    _ => {}
                }
                vm.send_to_agent(&bytes);
            }
        }
        let ran = vm.run(deadline);
        if let Ok(VmEvent::AgentOutput(bytes)) = &ran {
            outputs.push(bytes);
        }
        let live = seam.is_live();
        announce(live);
        match ran {
            Ok(VmEvent::AgentOutput(_) | VmEvent::DebugStop(_)) => {}
            Err(VmError::Stopped(why)) if live && why == AT_FORK_POINT => {}
            Err(VmError::Stopped(_)) if !live && replayer.pending_agent_input().is_some() => {}
            Err(error @ VmError::Timeout { .. }) => return Err(error.into()),
            Ok(VmEvent::Halted) if live && power_off_sent => return Ok(LiveEnd::PoweredOff),
            ended if live => return Ok(LiveEnd::Failed(live_failure(ended, outputs))),
            ended => return Err(replay_failure(replayer, ended, vm.rip())),
        }
        if live {
            if let Some(reason) = &outputs.failed {
                return Ok(LiveEnd::Failed(format!("the guest agent failed: {reason}")));
            }
        }
    }
}

/// How a fork that failed with `error` is reported, given the error its
/// log met (`log_error`), if any: that error stops the VM, and the replay
/// then looks diverged; the fork failing is what happened.
fn fork_failure(error: ForkError, log_error: Option<String>, output: &Path) -> ForkError {
    match (error, log_error) {
        (ForkError::Diverged(_), Some(error)) => ForkError::Log {
            path: output.to_owned(),
            error,
        },
        (error, _) => error,
    }
}

/// Why the live part ended early, in words.
fn live_failure(ended: Result<VmEvent, VmError>, outputs: &AgentOutputs) -> String {
    match ended {
        Ok(VmEvent::Reset) => {
            "the guest kernel reset the machine (a kernel panic, or a reboot)".into()
        }
        Ok(VmEvent::Halted) if outputs.finished.is_none() => {
            "the guest halted before the command finished".into()
        }
        Ok(other) => format!("the guest stopped unexpectedly ({other:?})"),
        Err(error) => format!("the VM failed: {error}"),
    }
}

/// The replay part ended before the fork point.
fn replay_failure(
    replayer: &provm_seams::Replayer,
    ended: Result<VmEvent, VmError>,
    rip: u64,
) -> ForkError {
    match replayer.finish(ended, rip) {
        Ok(provm_seams::ReplayEnd::Diverged { divergence, rip }) => ForkError::Diverged(format!(
            "replay diverged at {divergence}  guest RIP at the divergence: {rip:#x}"
        )),
        Ok(_) => ForkError::NeverForked,
        Err(error) => ForkError::Vm(error),
    }
}

/// How the fork's live part ended, in the words of its outcome.
fn ending(end: &LiveEnd, outputs: &AgentOutputs) -> Ending {
    let complete = matches!(end, LiveEnd::PoweredOff);
    Ending {
        complete,
        ended: match (end, outputs.finished) {
            (LiveEnd::PoweredOff, Some(finished)) => format!("the command ended: {finished:?}"),
            (LiveEnd::PoweredOff, None) => "the guest powered off".into(),
            (LiveEnd::Failed(why), _) => why.clone(),
        },
        exit_status: outputs
            .finished
            .filter(|_| complete)
            .map(|finished| finished.shell_status()),
    }
}

/// The recording's embedded image, as it is.
fn recorded_section(recording: &Path, kind: SectionKind) -> Result<Vec<u8>, FormatError> {
    let mut reader = TraceReader::open(recording)?;
    while let Some(header) = reader.next_header()? {
        if header.kind == kind {
            return Ok(reader.read_payload(header)?.payload);
        }
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replay "diverged" where the fork's log failed: a tool failure.
    #[test]
    fn a_log_that_failed_is_the_fork_failing_not_a_divergence() {
        let output = Path::new("fork.provm");
        let diverged = || ForkError::Diverged("the replay stopped".into());
        let failed = fork_failure(diverged(), Some("File too large".into()), output);
        assert!(failed.is_tool_failure());
        assert!(failed.to_string().contains("File too large"), "{failed}");
        assert!(matches!(
            fork_failure(diverged(), None, output),
            ForkError::Diverged(_)
        ));
        assert!(!fork_failure(ForkError::NoJob, None, output).is_tool_failure());
    }
}
