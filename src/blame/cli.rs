//! The command line of `provm blame` and of the timing flags of `run`,
//! `record` and `replay`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use provm_vmm::exit_timing::ExitDelay;

use super::{compare, inject, load, svg, table, BlameError, TimingOptions};
use crate::output::AtomicFile;

/// Exit timing and injected delays, for `run`, `record` and `replay`.
#[derive(clap::Args, Clone, Debug)]
pub struct TimingArgs {
    /// Capture where the host's time goes at every VM exit, per guest
    /// process and device, and write it to FILE as JSON (`provm blame FILE`).
    /// A recording keeps it in its trace anyway.
    #[arg(id = "timing", long = "timing", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Wait DURATION more after each exit of DEVICE before re-entering the
    /// guest (e.g. virtio-blk:200us): a known cost, to check blame against.
    #[arg(long, value_name = "DEVICE:DURATION", value_parser = inject::parse_exit_delay)]
    pub inject_exit_delay: Option<ExitDelay>,
}

impl TimingArgs {
    /// The options; `capture` when the run keeps timing without `--timing`
    /// (a recording).
    pub fn options(&self, capture: bool) -> TimingOptions {
        TimingOptions {
            capture,
            output: self.output.clone(),
            delay: self.inject_exit_delay.clone(),
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum BlameFormat {
    Text,
    Csv,
    Json,
}

#[derive(clap::Args)]
pub struct BlameArgs {
    /// A trace (its timing section) or a `provm run --timing` file; with a
    /// second, the differences from the first to the second.
    #[arg(required = true, num_args = 1..=2, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: BlameFormat,
    /// Also draw it as SVG: a stacked bar per process, and the exit latency
    /// distribution of each device.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Replay the trace as recorded and with one device's exits costing
    /// more (DEVICE=+DURATION, or DEVICE=xFACTOR for its VMM time times
    /// FACTOR), and set each process's measured time against the predicted.
    #[arg(long, value_name = "CHANGE", value_parser = inject::parse_what_if, conflicts_with = "format")]
    pub what_if: Option<ExitDelay>,
    /// With --what-if: give up a replay after this many seconds.
    #[arg(long, default_value_t = provm_engine::run::DEFAULT_TIMEOUT_SECONDS)]
    pub timeout: u64,
    /// Overwrite --svg if it exists.
    #[arg(long)]
    pub force: bool,
}

pub fn blame(args: BlameArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    crate::output::refuse_existing(args.force, [args.svg.as_deref()])?;
    let mut out = std::io::stdout().lock();
    if let Some(delay) = &args.what_if {
        let [trace] = args.runs.as_slice() else {
            return Err(BlameError::WhatIfOneTrace.into());
        };
        let predictions = compare::what_if(trace, delay, Duration::from_secs(args.timeout))?;
        compare::write_what_if(delay, &predictions, &mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let first = load(&args.runs[0])?;
    if let Some(second) = args.runs.get(1) {
        compare::write_difference(&first, &load(second)?, &mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    match args.format {
        BlameFormat::Text => table::write_text(&first, &mut out)?,
        BlameFormat::Csv => table::write_csv(&first, &mut out)?,
        BlameFormat::Json => table::write_json(&first, &mut out)?,
    }
    if let Some(path) = &args.svg {
        AtomicFile::write(path, args.force, svg::render(&first).as_bytes())?;
        eprintln!("provm: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
