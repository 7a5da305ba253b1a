//! The provm command line.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use provm::blame::{BlameFormat, BlameRequest, TimingOptions};
use provm::export::ro_crate::License;
use provm::gdb::{DebugError, GdbError};
use provm::observers::RunObservers;
use provm::output::refuse_existing;
use provm::provenance::{self, Direction, Format};
use provm::query::OutputFormat;
use provm::repro::{ReproOptions, Verdict};
use provm_engine::host_paths::HostPaths;
use provm_engine::image::{self, ContainerError, ImageRef};
use provm_engine::pinning::Pinning;
use provm_engine::record::RecordOptions;
use provm_engine::replay::{ReplayError, ReplayOptions, ReplayReport};
use provm_engine::run::RunOptions;
use provm_vmm::cpu_baseline::Baseline;
use provm_vmm::exit_timing::ExitDelay;

/// provm's own failures exit with this status, so that they are not mistaken
/// for the command's (as `docker run` and `podman run` do).
const PROVM_FAILED: u8 = 125;
/// `provm replay` of a trace cut short that matched as far as it goes: not
/// the full check a complete trace gets, so not 0.
const REPLAY_CUT_SHORT: u8 = 3;
/// A tool observing a replay (an analysis, the debugger) failed: the
/// replay stopped without a verdict, which is neither a divergence (1) nor
/// provm failing to start (125).
const TOOL_FAILED: u8 = 4;

#[derive(Parser)]
#[command(
    name = "provm",
    version,
    about = "Run, record and replay a command's whole Linux VM on provm's own KVM VMM"
)]
struct Cli {
    /// More detail: -v shows the guest console and VMM events, -vv every exit.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot IMAGE (qcow2 or raw, or a container image: oci:DIR[:TAG],
    /// oci-archive:FILE[:TAG], docker-archive:FILE[:NAME:TAG]), run CMD
    /// inside its root file system and exit with CMD's status. The image is
    /// never written: guest writes go to a temporary overlay.
    Run(RunArgs),
    /// Like `run`, and record everything the guest receives into a trace
    /// that `provm replay` re-executes exactly.
    Record(RecordArgs),
    /// Re-execute a trace, checking every guest output against it, and at
    /// the end the exit status and disk writes: exit 0 when it matched to
    /// the guest's power-off, 1 at the first divergence, 3 when the
    /// recording was cut short and the replay matched it up to there.
    Replay(ReplayArgs),
    /// Is CMD reproducible? Runs it twice (--runs) with the clock and the
    /// entropy varied, compares exit status, stdout, stderr and every file
    /// written, and if they differ re-runs with one input pinned at a time
    /// to name the cause. Prints one verdict; exits 0 when reproducible, 1
    /// when not. With --pinned nothing is varied: a check of provm itself.
    Repro(ReproArgs),
    /// Verify a trace and show what it holds.
    Inspect {
        /// The trace (.provm).
        trace: PathBuf,
        /// List the trace's state checks instead: each one's event, memory
        /// digest, and whether it kept the page digests that name where
        /// memory differs.
        #[arg(long)]
        state: bool,
    },
    /// Show the provenance of a run captured with `--prov` (RUN: the file it
    /// wrote, or the trace of `provm record --prov`): which processes read
    /// and wrote which files.
    Graph(GraphArgs),
    /// Ask recorded runs a question in SQL (SQLite's): `provm query
    /// run.provm "SELECT kind, count(*) FROM events GROUP BY kind"`. Several
    /// runs load into the same tables, told apart by their `run` column;
    /// `--schema` lists the tables.
    Query(QueryArgs),
    /// Write a run out for other tools: its tables as a SQLite database, its
    /// timeline for Perfetto, its provenance as a Makefile.
    Export {
        #[command(subcommand)]
        what: ExportCommand,
    },
    /// How much of each guest process's time the virtualization layer
    /// cost (RUN: a trace, or `provm run --timing FILE`); with two runs,
    /// their differences; with --what-if, a replay under a changed cost.
    Blame(BlameArgs),
    /// Build or locate the guest kernel.
    Kernel {
        #[command(subcommand)]
        action: KernelAction,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Keep the overlay holding the guest's writes at this path (a qcow2
    /// whose backing file is IMAGE).
    #[arg(long, value_name = "PATH")]
    keep_overlay: Option<PathBuf>,
    /// Capture the command's provenance (its processes and the files they
    /// read and wrote) and write it to FILE, for `provm graph FILE`; a
    /// recording also keeps it in its trace (`provm graph TRACE`).
    #[arg(long = "prov", value_name = "FILE")]
    provenance: Option<PathBuf>,
    /// After the command, copy what it left at GUEST_PATH in the guest (a
    /// directory, made empty beforehand if the image lacks it, or a file) to
    /// HOST_PATH, whole or not at all (repeatable). A recording keeps it in
    /// the trace too: `provm export files` gets it back.
    #[arg(long = "output", value_name = "GUEST_PATH:HOST_PATH",
          value_parser = provm_engine::transfer::Output::parse)]
    outputs: Vec<provm_engine::transfer::Output>,
    /// Overwrite output files that exist (the trace, --output, --prov,
    /// --keep-overlay).
    #[arg(long)]
    force: bool,
    /// Give the guest a network card behind provm's NAT: the guest is
    /// 10.0.2.15 and reaches the host's 127.0.0.1 as 10.0.2.2 (outbound
    /// TCP only, no DNS). A recording logs every frame the guest receives,
    /// so its replay needs no network.
    #[arg(long)]
    net: bool,
    #[command(flatten)]
    timing: TimingArgs,
    #[command(flatten)]
    guest: GuestArgs,
}

/// The command and the machine it runs in: what `run`, `record` and
/// `repro` share.
#[derive(clap::Args)]
struct GuestArgs {
    /// Guest memory in MiB (each 128 MiB adds seconds of boot where guest
    /// ring 0 is emulated).
    #[arg(long, default_value_t = provm_engine::run::DEFAULT_MEMORY_MIB)]
    memory: u64,
    /// The guest's vCPUs, 1 to 64. More than one boots the SMP kernel
    /// variant (`provm kernel build --smp`); they run one at a time,
    /// switched at VM exits, and a recording logs the schedule.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u8).range(1..=i64::from(provm_vmm::mp_table::MAX_CPUS)))]
    cpus: u8,
    /// Give up (and stop the guest) after this many seconds.
    #[arg(long, default_value_t = provm_engine::run::DEFAULT_TIMEOUT_SECONDS)]
    timeout: u64,
    /// Set an environment variable for CMD (repeatable); added to a minimal
    /// default environment (PATH, HOME, LANG).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory of CMD inside the image (default: a container
    /// image's WorkingDir, else /).
    #[arg(long)]
    cwd: Option<String>,
    /// Give CMD the host's file or folder HOST_PATH at GUEST_PATH, read-only
    /// (repeatable). It is copied into guest memory before CMD starts (see
    /// --memory) and hides what the image has there; a recording keeps it
    /// in the trace, so a replay needs nothing from the host.
    #[arg(long = "input", value_name = "HOST_PATH:GUEST_PATH",
          value_parser = provm_engine::transfer::Input::parse)]
    inputs: Vec<provm_engine::transfer::Input>,
    /// The root file system's device: /dev/vdaN, vdaN or N. By default the
    /// whole disk if it holds a file system, else the Linux root partition.
    #[arg(long)]
    root: Option<String>,
    /// Boot this vmlinux instead of the one `provm kernel build` made.
    #[arg(long)]
    kernel: Option<PathBuf>,
    #[command(flatten)]
    pinning: PinningArgs,
    /// The disk image (qcow2 or raw), or a container image as skopeo names
    /// it: oci:DIR[:TAG], oci-archive:FILE[:TAG] or
    /// docker-archive:FILE[:NAME:TAG], made into a disk once and cached by
    /// its digest. Its Env, WorkingDir, User and Entrypoint/Cmd are the command's
    /// defaults.
    #[arg(value_parser = parse_image)]
    image: ImageRef,
    /// The command and its arguments (a container image's Entrypoint and
    /// Cmd when none is given; a command given replaces both).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(clap::Args)]
struct ReproArgs {
    /// How many runs with varied inputs to compare (at least 2).
    #[arg(long, default_value_t = 2, value_parser = parse_runs)]
    runs: usize,
    #[command(flatten)]
    guest: GuestArgs,
}

#[derive(clap::Args)]
struct PinningArgs {
    /// Make the run reproducible: guest time is logical (it starts at
    /// --epoch and moves with the guest's progress, never with the host's)
    /// and the guest's entropy comes from --seed. Two pinned runs of a
    /// command on an image are the same run: same output, same event log
    /// (its SHA-256 is printed on stderr).
    #[arg(long)]
    pinned: bool,
    /// The pinned run's entropy seed: up to 64 hex digits.
    #[arg(long, value_name = "HEX", requires = "pinned", value_parser = provm_engine::pinning::parse_seed)]
    seed: Option<[u8; 32]>,
    /// The pinned run's wall-clock time at the start: RFC 3339
    /// (2000-01-01T00:00:00Z, the default) or seconds since the Unix epoch.
    #[arg(long, value_name = "TIME", requires = "pinned", value_parser = provm_engine::pinning::parse_epoch)]
    epoch: Option<u64>,
}

impl PinningArgs {
    fn pinning(&self) -> Option<Pinning> {
        let default = Pinning::default();
        self.pinned.then(|| Pinning {
            seed: self.seed.unwrap_or(default.seed),
            epoch_ns: self.epoch.unwrap_or(default.epoch_ns),
            ..default
        })
    }
}

#[derive(clap::Args)]
struct RecordArgs {
    /// Where to write the trace (default: IMAGE's name and the time, here).
    #[arg(short = 'o', long = "trace", value_name = "TRACE")]
    output: Option<PathBuf>,
    /// Embed the base image too (compressed): the trace alone replays.
    #[arg(long)]
    embed_image: bool,
    /// After this many seconds without a VM exit while a timer interrupt
    /// waits (0: never): stop a guest kernel that spent them going round
    /// the same register states, spinning with interrupts on (it can only
    /// get the tick at an exit; a kernel still working goes on), and warn,
    /// once, about guest user code computing (a long computation is normal).
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    exitless_limit: u64,
    /// Leave the exit timing (`provm blame`) out of the trace.
    #[arg(long)]
    no_timing: bool,
    /// With --cpus N > 1: draw the vCPU schedule (when each vCPU runs, for
    /// how many exits) from SEED, so that different seeds interleave the
    /// guest's threads differently. The trace replays exactly, whatever
    /// the seed.
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// Name the host's files (the image and its backing files, the kernel)
    /// by their paths in the trace and its provenance, instead of by file
    /// name and digest alone: a published trace then shows your user name
    /// and directory layout.
    #[arg(long)]
    keep_host_paths: bool,
    /// The guest's CPU: `host`, this host's (less what provm hides), or a
    /// named baseline that keeps only that x86-64 level's features, so that
    /// the trace replays on any host that can offer it (not on PVM).
    #[arg(long, value_name = "MODEL", default_value = "host",
          value_parser = clap::builder::TypedValueParser::map(
              clap::builder::PossibleValuesParser::new(Baseline::NAMES),
              |name| name.parse::<Baseline>().expect("one of the names")))]
    cpu: Baseline,
    #[command(flatten)]
    run: RunArgs,
}

/// What every command that replays a trace takes: the trace, the image to
/// replay it against and how long it may take.
#[derive(clap::Args)]
struct TraceArgs {
    /// The trace (.provm); `graph` also takes the file `--prov` wrote.
    #[arg(value_name = "TRACE")]
    trace: PathBuf,
    /// Replay against this image instead of the recorded one (found by its
    /// recorded name, beside the trace, where this host recorded it, made
    /// again from the recorded container image, or in the trace; its
    /// digest must match the recorded one). A container image as `run`
    /// takes it gives the disk made of it.
    #[arg(long, value_parser = parse_image)]
    image: Option<ImageRef>,
    /// Give up replaying after this many seconds.
    #[arg(long, default_value_t = provm_engine::run::DEFAULT_TIMEOUT_SECONDS)]
    timeout: u64,
}

impl TraceArgs {
    fn replay_options(self, echo_console: bool) -> Result<ReplayOptions, ContainerError> {
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

fn parse_image(text: &str) -> Result<ImageRef, std::convert::Infallible> {
    Ok(ImageRef::parse(text))
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum VerdictFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// Run analyses on the replay (repeatable, or comma-separated):
    /// `syscalls` logs every system call of every guest process, `processes`
    /// shows the process tree, `provenance` what the job's processes read
    /// and wrote (`provm graph` draws it). Text goes to standard output.
    #[arg(long, value_name = "NAME", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(provm_analysis::builtin::NAMES))]
    analyze: Vec<String>,
    /// Write the analyses' findings here as JSON lines (with --analyze), or
    /// the kernel (with --extract-kernel).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Refused: a replay has the recording's vCPUs (the trace decides).
    #[arg(long, hide = true, value_name = "N")]
    cpus: Option<String>,
    /// Write the trace's guest kernel (vmlinux, with its symbols, for gdb)
    /// to --output instead of replaying.
    #[arg(long, requires = "output", conflicts_with_all = ["analyze", "timing", "inject_exit_delay"])]
    extract_kernel: bool,
    /// Serve the replay to gdb on ADDRESS (e.g. 127.0.0.1:1234), with
    /// time travel (reverse-continue, reverse-stepi, `monitor event N`); see
    /// the README.
    #[arg(long, value_name = "ADDRESS",
          conflicts_with_all = ["analyze", "extract_kernel", "fork_at", "timing", "inject_exit_delay"])]
    gdb: Option<String>,
    /// With --gdb: take a time-travel snapshot every this many log events at
    /// first (more often: going back re-executes less, and more snapshots
    /// are taken; at most 32 are kept, then every other one goes and the
    /// interval doubles).
    #[arg(long, value_name = "EVENTS", requires = "gdb",
          default_value_t = provm::gdb::SNAPSHOT_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: u64,
    /// Overwrite --output if it exists.
    #[arg(long)]
    force: bool,
    /// How to print the verdict: words, or a JSON object (the verdict, its
    /// words, and a divergence's explanation: event, process, the pages
    /// that differ and their owners).
    #[arg(long, value_enum, default_value = "text")]
    format: VerdictFormat,
    /// Where a state check finds memory differing in a file's pages, replay
    /// again with the provenance analysis to name the processes that wrote
    /// the file (the pages and their owners are named without it).
    #[arg(long)]
    explain: bool,
    #[command(flatten)]
    fork: ForkArgs,
    #[command(flatten)]
    timing: TimingArgs,
    #[command(flatten)]
    trace: TraceArgs,
}

/// A what-if fork of the replay (see src/fork/).
#[derive(clap::Args)]
struct ForkArgs {
    /// Replay exactly up to this point, then go on live with --inject and
    /// write the fork's trace to --output: an event number (`provm query`
    /// shows them), disk-write:N or disk-read:N (the Nth, from 1).
    #[arg(long, value_name = "POINT", requires_all = ["inject", "output"],
          conflicts_with_all = ["analyze", "extract_kernel", "timing", "inject_exit_delay"])]
    fork_at: Option<provm::fork::ForkPoint>,
    /// The fault the fork injects: none, disk-error (the next disk read or
    /// write fails with an I/O error), clock=+3600s (the guest's clock
    /// reads that much later), entropy=SEED (hex).
    #[arg(long, value_name = "FAULT", requires = "fork_at")]
    inject: Option<provm::fork::Fault>,
}

/// Exit timing and injected delays, for `run`, `record` and `replay`.
#[derive(clap::Args, Clone, Debug)]
struct TimingArgs {
    /// Capture where the host's time goes at every VM exit, per guest
    /// process and device, and write it to FILE as JSON (`provm blame FILE`).
    /// A recording keeps it in its trace anyway.
    #[arg(id = "timing", long = "timing", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Wait DURATION more after each exit of DEVICE before re-entering the
    /// guest (e.g. virtio-blk:200us): a known cost, to check blame against.
    #[arg(long, value_name = "DEVICE:DURATION", value_parser = provm::blame::inject::parse_exit_delay)]
    inject_exit_delay: Option<ExitDelay>,
}

impl TimingArgs {
    /// The options; `capture` when the run keeps timing without `--timing`
    /// (a recording).
    fn options(&self, capture: bool) -> TimingOptions {
        TimingOptions {
            capture,
            output: self.output.clone(),
            delay: self.inject_exit_delay.clone(),
        }
    }
}

#[derive(clap::Args)]
struct BlameArgs {
    /// A trace (its timing section) or a `provm run --timing` file; with a
    /// second, the differences from the first to the second.
    #[arg(required = true, num_args = 1..=2, value_name = "RUN")]
    runs: Vec<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    format: BlameFormat,
    /// Also draw it as SVG: a stacked bar per process, and the exit latency
    /// distribution of each device.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Replay the trace as recorded and with one device's exits costing
    /// more (DEVICE=+DURATION, or DEVICE=xFACTOR for its VMM time times
    /// FACTOR), and set each process's measured time against the predicted.
    #[arg(long, value_name = "CHANGE", value_parser = provm::blame::inject::parse_what_if, conflicts_with = "format")]
    what_if: Option<ExitDelay>,
    /// With --what-if: give up a replay after this many seconds.
    #[arg(long, default_value_t = provm_engine::run::DEFAULT_TIMEOUT_SECONDS)]
    timeout: u64,
    /// Overwrite --svg if it exists.
    #[arg(long)]
    force: bool,
}

impl BlameArgs {
    fn request(self) -> BlameRequest {
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
struct GraphArgs {
    /// RUN: the run's provenance, as `provm run --prov` wrote it, or a
    /// trace: its embedded provenance (`provm record --prov`), else the
    /// provenance derived from its system calls by replaying it.
    #[command(flatten)]
    run: TraceArgs,
    /// Derive the graph from a replay of the trace even if it embeds the
    /// in-guest tracer's (to compare the two).
    #[arg(long)]
    from_replay: bool,
    /// What to write: PROV-JSON (complete), or DOT and SVG for people (shared
    /// libraries, /proc and similar noise collapsed into a note).
    #[arg(long, value_enum, default_value = "dot")]
    format: Format,
    /// Only what this file (its last version) came from: the processes and
    /// files upstream of it.
    #[arg(long, value_name = "PATH", conflicts_with = "outputs_of")]
    inputs_of: Option<String>,
    /// Only what this file (any version of it) fed into: the processes and
    /// files downstream of it.
    #[arg(long, value_name = "PATH")]
    outputs_of: Option<String>,
    /// Write here instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Overwrite --output if it exists.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct QueryArgs {
    /// How to print the rows.
    #[arg(long, value_enum, default_value = "table")]
    format: OutputFormat,
    /// Print the tables, their columns and what they hold, and exit.
    #[arg(long, exclusive = true)]
    schema: bool,
    /// The traces (.provm), then the query.
    #[arg(
        value_name = "RUN... SQL",
        num_args = 2..,
        required_unless_present = "schema"
    )]
    runs_then_sql: Vec<String>,
}

#[derive(Subcommand)]
enum ExportCommand {
    /// `provm query`'s tables, filled, as a SQLite database file (for any
    /// SQLite client, Python's sqlite3, pandas or DuckDB).
    Sqlite {
        /// The traces (.provm).
        #[arg(required = true, value_name = "RUN")]
        runs: Vec<PathBuf>,
        /// Also fill the tables that come from replaying each run (the
        /// system calls): as long again as the runs took.
        #[arg(long)]
        with_replay: bool,
        #[command(flatten)]
        output: ExportOutput,
    },
    /// The run as a timeline in the Trace Event Format, for Perfetto
    /// (ui.perfetto.dev) or chrome://tracing: one track per guest process
    /// (with --prov), VM exits by device, interrupts and disk writes, and
    /// the VMM's time by device (when the trace keeps exit timing).
    Timeline {
        /// The trace (.provm).
        run: PathBuf,
        /// Also replay the run, for every system call on its thread (and the
        /// processes, without --prov): as long again as the run took.
        #[arg(long)]
        with_replay: bool,
        #[command(flatten)]
        output: ExportOutput,
    },
    /// The files the run read and executed (programs, libraries, inputs),
    /// out of the recorded image, as an OCI image archive whose entrypoint is
    /// the recorded command: `skopeo copy oci-archive:FILE:run ...`. Without
    /// --prov in the trace, its provenance is derived by replaying it.
    Oci {
        #[command(flatten)]
        run: TraceArgs,
        #[command(flatten)]
        output: ExportOutput,
    },
    /// What a run recorded with `--output GUEST_PATH:HOST_PATH` copied back
    /// from GUEST_PATH, out of its trace (no replay): written to DIR, a
    /// directory or a file as it was in the guest.
    Files {
        /// The trace (.provm).
        run: PathBuf,
        /// The guest path, as --output named it.
        guest_path: String,
        #[command(flatten)]
        output: ExportOutput,
    },
    /// The artifact a paper deposits: a directory holding the trace, a
    /// README saying how to check it (`provm inspect`, `provm replay`) and
    /// ro-crate-metadata.json, a Workflow Run RO-Crate (Process Run Crate)
    /// describing the run: the command, its inputs and outputs (from its
    /// provenance: recorded with --prov, else derived by replaying it), its
    /// start and end. `scripts/check-ro-crate DIR` validates it.
    RoCrate {
        #[command(flatten)]
        run: TraceArgs,
        /// The directory to write the crate into: new or empty.
        #[arg(short, long, value_name = "DIR")]
        output: PathBuf,
        /// The crate's license: an SPDX identifier (CC-BY-4.0) or a URL.
        /// Without it the crate says that none was chosen.
        #[arg(long, value_name = "ID")]
        license: Option<String>,
        /// Write into DIR even if it holds files (the crate's own are
        /// replaced).
        #[arg(long)]
        force: bool,
    },
    /// The run's provenance (recorded with --prov, else derived by replaying
    /// it) as a Makefile: one rule
    /// per file it generated, the files its writer read as prerequisites,
    /// the writer's command line as recipe.
    Makefile {
        #[command(flatten)]
        run: TraceArgs,
        /// Write here instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Overwrite --output if it exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Args)]
struct ExportOutput {
    /// The file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Overwrite FILE if it exists.
    #[arg(long)]
    force: bool,
}

#[derive(Subcommand)]
enum KernelAction {
    /// Build the guest kernel from Debian's linux-source-6.1 (cached).
    Build {
        /// The SMP variant, which guests with --cpus N > 1 boot.
        #[arg(long)]
        smp: bool,
    },
    /// Print the path of the built kernel.
    Path {
        /// The SMP variant's.
        #[arg(long)]
        smp: bool,
    },
}

fn variant(smp: bool) -> provm_engine::kernel::Variant {
    match smp {
        true => provm_engine::kernel::Variant::Smp,
        false => provm_engine::kernel::Variant::Up,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result = match cli.command {
        Command::Run(args) => run(args, cli.verbose > 0),
        Command::Record(args) => record(args, cli.verbose > 0),
        Command::Replay(args) => replay(args, cli.verbose > 0),
        Command::Repro(args) => repro(args, cli.verbose > 0),
        Command::Inspect { trace, state } => if state {
            provm::inspect::state_checks(&trace)
        } else {
            provm::inspect::inspect(&trace)
        }
        .map(|text| {
            print!("{text}");
            ExitCode::SUCCESS
        })
        .map_err(Into::into),
        Command::Graph(args) => graph(args),
        Command::Query(args) => query(args),
        Command::Export { what } => export(what),
        Command::Blame(args) => blame(args),
        Command::Kernel { action } => kernel(action),
    };
    result.unwrap_or_else(|error| {
        eprintln!("provm: {error}");
        ExitCode::from(failure_status(error.as_ref()))
    })
}

/// The exit status of a failure: `TOOL_FAILED` where a tool observing a
/// replay failed, else `PROVM_FAILED`.
fn failure_status(error: &(dyn std::error::Error + 'static)) -> u8 {
    let tool = matches!(
        error.downcast_ref::<ReplayError>(),
        Some(ReplayError::Analysis { .. })
    ) || matches!(
        error.downcast_ref::<GdbError>(),
        Some(GdbError::Debug(debug)) if !matches!(debug, DebugError::Replay(_))
    ) || error
        .downcast_ref::<provm::fork::ForkError>()
        .is_some_and(provm::fork::ForkError::is_tool_failure);
    if tool {
        TOOL_FAILED
    } else {
        PROVM_FAILED
    }
}

fn run(args: RunArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    refuse_existing(
        args.force,
        [
            args.provenance.as_deref(),
            args.keep_overlay.as_deref(),
            args.timing.output.as_deref(),
        ],
    )?;
    let timing = args.timing.options(false);
    let provenance = args.provenance.clone();
    let options = run_options(args, verbose)?;
    let mut observers = RunObservers::new(&options, "run", &timing, provenance);
    let ran = provm_engine::run::run(
        &options,
        &mut observers.all(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )?;
    observers.finish()?;
    if let Some(digest) = &ran.events_sha256 {
        eprintln!("provm: event log sha256 {digest}");
    }
    Ok(ExitCode::from(ran.outcome.shell_status() as u8))
}

fn record(args: RecordArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let output = args
        .output
        .unwrap_or_else(|| provm_engine::record::default_output(args.run.guest.image.path()));
    let run = &args.run;
    refuse_existing(
        run.force,
        [
            Some(output.as_path()),
            run.provenance.as_deref(),
            run.keep_overlay.as_deref(),
            run.timing.output.as_deref(),
        ],
    )?;
    let timing = args.run.timing.options(!args.no_timing);
    let provenance = args.run.provenance.clone();
    let mut run = run_options(args.run, verbose)?;
    run.cpu = args.cpu;
    if args.keep_host_paths {
        run.host_paths = HostPaths::Kept;
    }
    let options = RecordOptions {
        run,
        output,
        embed_image: args.embed_image,
        exitless_limit: (args.exitless_limit > 0).then(|| Duration::from_secs(args.exitless_limit)),
        chaos: args.chaos,
    };
    let mut observers = RunObservers::new(&options.run, "record", &timing, provenance);
    let recorded = provm_engine::record::record(
        &options,
        &mut observers.all(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    // A recording cut short still has its timing.
    observers.finish()?;
    let recorded = recorded?;
    eprintln!("provm: recorded {}", recorded.trace.display());
    eprintln!("provm: event log sha256 {}", recorded.events_sha256);
    Ok(ExitCode::from(recorded.outcome.shell_status() as u8))
}

fn replay(args: ReplayArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
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
        .map(|name| provm_analysis::builtin::by_name(name).expect("clap checked the name"))
        .collect();
    let mut timing = args.timing.options(false).observer("replay");
    let (report, analyses) =
        provm_engine::replay::replay_observed(&options, &mut [&mut timing], analyses)?;
    timing.save_requested()?;
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

/// The exit code of a replay that ended with `report`.
fn verdict_status(report: &ReplayReport) -> ExitCode {
    match report {
        ReplayReport::Matched { .. } => ExitCode::SUCCESS,
        ReplayReport::CutShort { .. } => ExitCode::from(REPLAY_CUT_SHORT),
        ReplayReport::Diverged { .. } => ExitCode::from(1),
    }
}

fn run_options(args: RunArgs, verbose: bool) -> Result<RunOptions, Box<dyn std::error::Error>> {
    Ok(RunOptions {
        keep_overlay: args.keep_overlay,
        outputs: args.outputs,
        force_outputs: args.force,
        net: args.net,
        ..guest_options(args.guest, verbose)?
    })
}

/// The run's options; a container image is resolved to its disk here, and
/// its configuration gives the command's defaults.
fn guest_options(args: GuestArgs, verbose: bool) -> Result<RunOptions, Box<dyn std::error::Error>> {
    let resolved = image::resolve(&args.image)?;
    let defaults = resolved
        .container
        .as_ref()
        .map(|container| container.config.clone())
        .unwrap_or_default();
    let command = match args.command.is_empty() {
        true => defaults.command.iter().map(OsString::from).collect(),
        false => args.command,
    };
    if command.is_empty() {
        return Err(format!(
            "no command: give it after `--` (provm run {} -- CMD ARGS...){}",
            args.image,
            match resolved.container {
                Some(_) => "; the image names none (no Entrypoint or Cmd)",
                None => "",
            }
        )
        .into());
    }
    Ok(RunOptions {
        pinned: args.pinning.pinning(),
        env: defaults.env.into_iter().chain(args.env).collect(),
        cwd: args
            .cwd
            .or(defaults.working_dir)
            .unwrap_or_else(|| "/".into()),
        user: defaults.user,
        root: args.root,
        memory_mib: args.memory,
        cpus: args.cpus,
        timeout: Duration::from_secs(args.timeout),
        kernel: args.kernel,
        echo_console: verbose,
        inputs: args.inputs,
        stdin: host_stdin()?,
        container: resolved.container,
        ..RunOptions::new(resolved.disk, command)
    })
}

/// provm's standard input, for the command: read to its end (like `docker
/// run -i`), unless it is a terminal, which would wait for a user who
/// meant no input; `None` for a terminal or nothing.
fn host_stdin() -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{IsTerminal, Read};
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    stdin.lock().read_to_end(&mut bytes)?;
    Ok((!bytes.is_empty()).then_some(bytes))
}

/// `--runs N`: a comparison needs two runs at least.
fn parse_runs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(runs) if runs >= 2 => Ok(runs),
        _ => Err("give a number of runs of 2 or more (a comparison needs two)".into()),
    }
}

fn repro(args: ReproArgs, verbose: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let options = ReproOptions {
        run: guest_options(args.guest, verbose)?,
        runs: args.runs,
    };
    let verdict = provm::repro::repro(&options, &mut std::io::stderr())?;
    println!("{verdict}");
    Ok(match verdict {
        Verdict::Reproducible { .. } => ExitCode::SUCCESS,
        Verdict::Irreproducible { .. } => ExitCode::from(1),
    })
}

fn graph(args: GraphArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    refuse_existing(args.force, [args.output.as_deref()])?;
    let replay = args.run.replay_options(false)?;
    let mut document = provenance::load_or_derive(&replay, args.from_replay)?;
    if !document.has_processes() {
        return Err(provenance::ProvenanceError::Empty.into());
    }
    let query = match (args.inputs_of, args.outputs_of) {
        (Some(path), _) => Some((path, Direction::Inputs)),
        (None, Some(path)) => Some((path, Direction::Outputs)),
        (None, None) => None,
    };
    if let Some((path, direction)) = query {
        document = provenance::lineage(&document, &path, direction)?;
    }
    let bytes = provenance::render(&document, args.format)?;
    match &args.output {
        Some(path) => std::fs::write(path, bytes)
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?,
        None => std::io::Write::write_all(&mut std::io::stdout(), &bytes)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn blame(args: BlameArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let request = args.request();
    provm::blame::blame(&request, &mut std::io::stdout().lock())?;
    if let Some(path) = &request.svg {
        eprintln!("provm: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn query(args: QueryArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.schema {
        print!("{}", provm::query::schema(true));
        return Ok(ExitCode::SUCCESS);
    }
    let (sql, runs) = args
        .runs_then_sql
        .split_last()
        .expect("clap requires a run and a query");
    let runs = open_runs(runs.iter().map(PathBuf::from))?;
    let db = provm::query::for_query(&runs, sql)?;
    provm::query::print(&db, sql, args.format, &mut std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

fn open_runs(
    paths: impl IntoIterator<Item = PathBuf>,
) -> Result<Vec<provm::query::Run>, provm::query::QueryError> {
    paths
        .into_iter()
        .map(|path| provm::query::Run::open(&path))
        .collect()
}

fn export(what: ExportCommand) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match what {
        ExportCommand::Sqlite {
            runs,
            with_replay,
            output,
        } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let runs = open_runs(runs)?;
            provm::export::sqlite(&runs, &output.output, output.force, with_replay)?;
        }
        ExportCommand::Timeline {
            run,
            with_replay,
            output,
        } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let run = provm::query::Run::open(&run)?;
            if !provm::export::timeline(&run, &output.output, output.force, with_replay)? {
                eprintln!("provm: {} has no provenance, so the timeline has no process tracks; record with --prov, or export with --with-replay, to have them", run.name);
            }
        }
        ExportCommand::Oci { run, output } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let written = provm::export::oci_archive(
                &run.replay_options(false)?,
                &output.output,
                output.force,
            )?;
            eprintln!(
                "provm: wrote {} (oci-archive, tag {}): {} bytes",
                output.output.display(),
                provm::export::OCI_TAG,
                written
            );
        }
        ExportCommand::Files {
            run,
            guest_path,
            output,
        } => {
            refuse_existing(output.force, [Some(output.output.as_path())])?;
            let delivered = provm::export::files(&run, &guest_path, &output.output, output.force)?;
            eprintln!(
                "provm: wrote {} ({} files, {} bytes)",
                output.output.display(),
                delivered.files,
                delivered.bytes
            );
        }
        ExportCommand::RoCrate {
            run,
            output,
            license,
            force,
        } => {
            let license = license.map_or_else(
                || {
                    eprintln!("provm: no --license: the crate says that none was chosen; choose one before depositing it");
                    License::Unchosen
                },
                License::Chosen,
            );
            provm::export::ro_crate::ro_crate(
                &run.replay_options(false)?,
                &output,
                force,
                &license,
            )?;
            eprintln!(
                "provm: wrote the RO-Crate {}; scripts/check-ro-crate validates it",
                output.display()
            );
        }
        ExportCommand::Makefile { run, output, force } => {
            refuse_existing(force, [output.as_deref()])?;
            let makefile = provm::export::makefile(&run.replay_options(false)?)?;
            match output {
                Some(path) => {
                    let mut file = provm::output::AtomicFile::create(&path, force)?;
                    std::io::Write::write_all(file.file(), makefile.as_bytes())?;
                    file.commit()?;
                }
                None => print!("{makefile}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn kernel(action: KernelAction) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let path = match action {
        KernelAction::Build { smp } => provm_engine::kernel::build(variant(smp))?,
        KernelAction::Path { smp } => provm_engine::kernel::find(variant(smp))?,
    };
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROVM_LOG")
        .unwrap_or_else(|_| level.into())
        // Shown by `Notices`, whatever the level.
        .add_directive(
            format!("{}=off", provm_engine::NOTICE)
                .parse()
                .expect("a valid directive"),
        );
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let notices = Notices.with_filter(tracing_subscriber::filter::filter_fn(|meta| {
        meta.target() == provm_engine::NOTICE
    }));
    tracing_subscriber::registry()
        .with(log)
        .with(notices)
        .init();
}

/// Prints the engine's notices (`provm_engine::notice!`) as `provm: MESSAGE`
/// lines on stderr.
struct Notices;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Notices {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        eprintln!("provm: {}", message.0);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// An analysis or debugger failing is told apart from a divergence and
    /// from a trace that could not be replayed at all.
    #[test]
    fn tool_failures_have_their_own_exit_status() {
        let vm_error = || provm_vmm::vm::VmError::Stopped("observer".into());
        let analysis = ReplayError::Analysis {
            event: 7,
            error: vm_error(),
        };
        assert_eq!(failure_status(&analysis), TOOL_FAILED);
        let stepping = GdbError::Debug(DebugError::NotFoundAgain {
            event: 7,
            hits: 1,
            rip: 0,
        });
        assert_eq!(failure_status(&stepping), TOOL_FAILED);
        let refused = GdbError::Debug(DebugError::Replay(ReplayError::NoWindowBreakpoints));
        assert_eq!(failure_status(&refused), PROVM_FAILED);
        assert_eq!(failure_status(&ReplayError::Vm(vm_error())), PROVM_FAILED);
        let fork_log = provm::fork::ForkError::Log {
            path: "fork.provm".into(),
            error: "No space left on device".into(),
        };
        assert_eq!(failure_status(&fork_log), TOOL_FAILED);
        let diverged = provm::fork::ForkError::Diverged("at event 7".into());
        assert_eq!(failure_status(&diverged), PROVM_FAILED);
    }

    /// Clap checks its own rules (unique argument ids, conflicts naming
    /// real arguments) only in this debug assertion; CI builds release.
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
