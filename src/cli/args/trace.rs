//! The options of the commands that read or replay a recorded run
//! (`replay`, `graph`, `blame`, `query`).

use std::path::PathBuf;
use std::time::Duration;

use provm::blame::{BlameFormat, BlameRequest};
use provm::provenance::Format;
use provm::query::OutputFormat;
use provm_engine::image::{self, ContainerError, ImageRef};
use provm_engine::replay::ReplayOptions;
use provm_vmm::exit_timing::ExitDelay;

use super::{parse_image, TimingArgs};

/// What every command that replays a trace takes: the trace, the image to
/// replay it against and how long it may take.
#[derive(clap::Args)]
pub struct TraceArgs {
    /// The trace (.provm); `graph` also takes the file `--prov` wrote.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Replay against this image instead of the recorded one (found by its
    /// recorded name, beside the trace, where this host recorded it, made
    /// again from the recorded container image, or in the trace; its
    /// digest must match the recorded one). A container image as `run`
    /// takes it gives the disk made of it.
    #[arg(long, value_parser = parse_image)]
    pub image: Option<ImageRef>,
    /// Give up replaying after this many seconds.
    #[arg(long, default_value_t = provm_engine::start::DEFAULT_TIMEOUT_SECONDS)]
    pub timeout: u64,
}

impl TraceArgs {
    pub fn replay_options(self, echo_console: bool) -> Result<ReplayOptions, ContainerError> {
        Ok(ReplayOptions {
            trace: self.trace,
            image: match &self.image {
                Some(image) => Some(image::resolve(image)?.disk),
                None => None,
            },
            timeout: Duration::from_secs(self.timeout),
            echo_console,
        })
    }
}

/// One run or several (`graph`, `export ro-crate`): TraceArgs' trace, then
/// more, each read as that one is.
#[derive(clap::Args)]
pub struct RunsArgs {
    #[command(flatten)]
    pub first: TraceArgs,
    /// More runs, in the order they ran: a file one left written and a
    /// later one read, with the same SHA-256, is one entity.
    #[arg(value_name = "RUN")]
    pub more: Vec<PathBuf>,
}

impl RunsArgs {
    /// How to read each run, in order (`--image` and `--timeout` apply to
    /// every run that is replayed).
    pub fn replay_options(self) -> Result<Vec<ReplayOptions>, ContainerError> {
        let first = self.first.replay_options(false)?;
        let more: Vec<ReplayOptions> = self
            .more
            .into_iter()
            .map(|trace| ReplayOptions {
                trace,
                image: first.image.clone(),
                timeout: first.timeout,
                echo_console: false,
            })
            .collect();
        Ok(std::iter::once(first).chain(more).collect())
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum VerdictFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Run analyses on the replay (repeatable, or comma-separated):
    /// `syscalls` logs every system call of every guest process, `processes`
    /// shows the process tree, `provenance` what the job's processes read
    /// and wrote (`provm graph` draws it). Text goes to standard output.
    #[arg(long, value_name = "NAME", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(provm::analyses::NAMES))]
    pub analyze: Vec<String>,
    /// Write the analyses' findings here as JSON lines (with --analyze), or
    /// the kernel (with --extract-kernel).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Refused: a replay has the recording's vCPUs (the trace decides).
    #[arg(long, hide = true, value_name = "N")]
    pub cpus: Option<String>,
    /// Write the trace's guest kernel (vmlinux, with its symbols, for gdb)
    /// to --output instead of replaying.
    #[arg(long, requires = "output", conflicts_with_all = ["analyze", "timing", "inject_exit_delay"])]
    pub extract_kernel: bool,
    /// Serve the replay to gdb on ADDRESS (e.g. 127.0.0.1:1234), with
    /// time travel (reverse-continue, reverse-stepi, `monitor event N`); see
    /// the README.
    #[arg(long, value_name = "ADDRESS",
          conflicts_with_all = ["analyze", "extract_kernel", "fork_at", "timing", "inject_exit_delay"])]
    pub gdb: Option<String>,
    /// With --gdb: take a time-travel snapshot every this many log events at
    /// first (more often: going back re-executes less, and more snapshots
    /// are taken; at most 32 are kept, then every other one goes and the
    /// interval doubles).
    #[arg(long, value_name = "EVENTS", requires = "gdb",
          default_value_t = provm::gdb::SNAPSHOT_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub snapshot_every: u64,
    /// Overwrite --output if it exists.
    #[arg(long)]
    pub force: bool,
    /// How to print the verdict: words, or a JSON object (the verdict, its
    /// words, and a divergence's explanation: event, process, the pages
    /// that differ and their owners).
    #[arg(long, value_enum, default_value = "text")]
    pub format: VerdictFormat,
    /// Where a state check finds memory differing in a file's pages, replay
    /// again with the provenance analysis to name the processes that wrote
    /// the file (the pages and their owners are named without it).
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub fork: ForkArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// A what-if fork of the replay (see src/fork/).
#[derive(clap::Args)]
pub struct ForkArgs {
    /// Replay exactly up to this point, then go on live with --inject and
    /// write the fork's trace to --output: an event number (`provm query`
    /// shows them), disk-write:N or disk-read:N (the Nth, from 1).
    #[arg(long, value_name = "POINT", requires_all = ["inject", "output"],
          conflicts_with_all = ["analyze", "extract_kernel", "timing", "inject_exit_delay"])]
    pub fork_at: Option<provm::fork::ForkPoint>,
    /// The fault the fork injects: none, disk-error (the next disk read or
    /// write fails with an I/O error), clock=+3600s (the guest's clock
    /// reads that much later), entropy=SEED (hex).
    #[arg(long, value_name = "FAULT", requires = "fork_at")]
    pub inject: Option<provm::fork::Fault>,
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
    #[arg(long, value_name = "CHANGE", value_parser = provm::blame::inject::parse_what_if, conflicts_with = "format")]
    pub what_if: Option<ExitDelay>,
    /// With --what-if: give up a replay after this many seconds.
    #[arg(long, default_value_t = provm_engine::start::DEFAULT_TIMEOUT_SECONDS)]
    pub timeout: u64,
    /// Overwrite --svg if it exists.
    #[arg(long)]
    pub force: bool,
}

impl BlameArgs {
    pub fn request(self) -> BlameRequest {
        BlameRequest {
            runs: self.runs,
            format: self.format,
            svg: self.svg,
            what_if: self.what_if,
            timeout: Duration::from_secs(self.timeout),
            force: self.force,
        }
    }
}

#[derive(clap::Args)]
pub struct GraphArgs {
    /// TRACE: the run's provenance, as `provm run --prov` wrote it, or a
    /// trace: its embedded provenance (`provm record --prov`), else the
    /// provenance derived from its system calls by replaying it.
    #[command(flatten)]
    pub runs: RunsArgs,
    /// Derive the graph from a replay of the trace even if it embeds the
    /// in-guest tracer's (to compare the two).
    #[arg(long)]
    pub from_replay: bool,
    /// What to write: PROV-JSON (complete), or DOT and SVG for people (shared
    /// libraries, /proc and similar noise collapsed into a note).
    #[arg(long, value_enum, default_value = "dot")]
    pub format: Format,
    /// Only what this file (its last version) came from: the processes and
    /// files upstream of it.
    #[arg(long, value_name = "PATH", conflicts_with = "outputs_of")]
    pub inputs_of: Option<String>,
    /// Only what this file (any version of it) fed into: the processes and
    /// files downstream of it.
    #[arg(long, value_name = "PATH")]
    pub outputs_of: Option<String>,
    /// Write here instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite --output if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args)]
pub struct QueryArgs {
    /// How to print the rows.
    #[arg(long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    /// Print the tables, their columns and what they hold, and exit.
    #[arg(long, exclusive = true)]
    pub schema: bool,
    /// The traces (.provm), then the query.
    #[arg(
        value_name = "RUN... SQL",
        num_args = 2..,
        required_unless_present = "schema"
    )]
    pub runs_then_sql: Vec<String>,
}
