//! `provm replay`: a trace replayed, forked, debugged or analysed, and its
//! verdict.

use std::process::ExitCode;

use provm::output::refuse_existing;
use provm_engine::replay::ReplayReport;

use super::args::{ReplayArgs, VerdictFormat};
use super::status::verdict_status;

pub fn replay(args: ReplayArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.cpus.is_some() {
        return Err("replay takes no --cpus: the trace decides (a replay has the recording's vCPUs; see `provm inspect TRACE`); --cpus is for run, record and repro".into());
    }
    refuse_existing(
        args.force,
        [args.output.as_deref(), args.timing.output.as_deref()],
    )?;
    let options = args.trace.replay_options(verbose)?;
    if let (Some(at), Some(fault)) = (args.fork.fork_at, args.fork.inject) {
        let options = provm::fork::ForkOptions {
            replay: options,
            at,
            fault,
            output: args.output.expect("clap requires --output"),
        };
        return provm::fork::run(&options).map_err(Into::into);
    }
    if args.extract_kernel {
        let output = args.output.expect("clap requires --output");
        let kernel = provm_trace::reader::Trace::open(&options.trace)?.kernel()?;
        provm::output::AtomicFile::write(&output, args.force, &kernel)?;
        eprintln!("provm: wrote the guest kernel to {}", output.display());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(address) = &args.gdb {
        let report = provm::gdb::serve(options, address, args.snapshot_every)?;
        return Ok(replay_verdict(report));
    }
    let analyses = args
        .analyze
        .iter()
        .map(|name| provm::analyses::by_name(name).expect("clap checked the name"))
        .collect();
    let timing_options = args.timing.options(false);
    let mut timing = timing_options.observer("replay");
    let (report, analyses) =
        provm_engine::replay::replay_observed(&options, &mut [&mut timing], analyses)?;
    timing_options.save_requested(&timing)?;
    for analysis in &analyses {
        analysis.report_text(&mut std::io::stdout().lock())?;
    }
    if let Some(output) = &args.output {
        let mut lines = Vec::new();
        for analysis in &analyses {
            analysis.report_json(&mut lines)?;
        }
        provm::output::AtomicFile::write(output, args.force, &lines)?;
    }
    if let VerdictFormat::Json = args.format {
        println!("{}", report.json());
        return Ok(verdict_status(&report));
    }
    let writers = match (&report, args.explain) {
        (
            ReplayReport::Diverged {
                explanation: Some(explanation),
                ..
            },
            true,
        ) => provm::explain::writers(&options, explanation)?,
        _ => Vec::new(),
    };
    let status = replay_verdict(report);
    for line in writers {
        println!("{line}");
    }
    Ok(status)
}

/// Prints the replay's verdict; its exit code.
fn replay_verdict(report: ReplayReport) -> ExitCode {
    println!("{}", report.summary());
    verdict_status(&report)
}
