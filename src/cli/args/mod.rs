//! The command line's grammar: clap's types, one per command and per group
//! of options that several commands share. Turning them into the engine's
//! and the features' options is each command's (see `cli/`), except where
//! a group converts itself (`TraceArgs::replay_options` and its likes).

mod guest;
mod trace;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use provm_engine::image::ImageRef;

pub use guest::{exitless_limit, GuestArgs, RecordArgs, ReproArgs, RunArgs, TimingArgs};
pub use trace::{BlameArgs, GraphArgs, QueryArgs, ReplayArgs, RunsArgs, TraceArgs, VerdictFormat};

#[derive(Parser)]
#[command(
    name = "provm",
    version,
    about = "Run, record and replay a command's whole Linux VM on provm's own KVM VMM"
)]
pub struct Cli {
    /// More detail: -v shows the guest console and VMM events, -vv every exit.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// With --cpus N --chaos-runs K it varies the vCPU schedule instead:
    /// K recordings, chaos seeds 1 to K, the seeds grouped by output and
    /// one trace per output kept to replay.
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
    /// Compare two recorded runs (of one command, e.g. across a sweep): whether
    /// they ran the same command on the same image, kernel and machine, the
    /// first input where their logs part (a clock, the entropy, what a device
    /// returned, an input file, a network reply) and the outputs that differ
    /// (exit status, stdout, stderr, files, disk writes). No replay: both
    /// traces are verified and read. Exits 0 when they are the same run, 1
    /// when they differ.
    Diff {
        /// The first run's trace (.provm).
        first: PathBuf,
        /// The second run's trace (.provm).
        second: PathBuf,
        /// Print one JSON object instead of words.
        #[arg(long)]
        json: bool,
    },
    /// Show the provenance of a run captured with `--prov` (RUN: the file it
    /// wrote, or the trace of `provm record --prov`): which processes read
    /// and wrote which files. Several runs make one graph, in which a file
    /// one run left written and another read is one node (by SHA-256).
    Graph(GraphArgs),
    /// Ask recorded runs a question in SQL (SQLite's): `provm query
    /// run.provm "SELECT kind, count(*) FROM events GROUP BY kind"`. Several
    /// runs load into the same tables, told apart by their `run` column;
    /// `--schema` lists the tables.
    Query(QueryArgs),
    /// Write a run out for other tools: its tables as a SQLite database or a
    /// Parquet dataset, its timeline for Perfetto, its provenance as a
    /// Makefile.
    Export {
        #[command(subcommand)]
        what: ExportCommand,
    },
    /// How much of each guest process's time the virtualization layer
    /// cost (RUN: a trace, or `provm run --timing FILE`); with two runs,
    /// their differences; with --what-if, a replay under a changed cost.
    Blame(BlameArgs),
    /// Make a trace of what a killed recording left (SIGKILL, a lost node,
    /// an engine's time limit): its unfinished file, `.NAME.XXXXXX.partial`
    /// beside the trace it was writing, kept up to its last event chunk
    /// written whole. The trace is cut short, as a timed-out recording's
    /// is, and replays to there. The unfinished file is removed once the
    /// trace verifies.
    Recover {
        /// The unfinished file.
        partial: PathBuf,
        /// The trace to write (default: NAME, the one the recording was
        /// writing).
        #[arg(short, long, value_name = "TRACE")]
        output: Option<PathBuf>,
        /// Overwrite TRACE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Build or locate the guest kernel.
    Kernel {
        #[command(subcommand)]
        action: KernelAction,
    },
}

#[derive(Subcommand)]
pub enum ExportCommand {
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
    /// `provm query`'s tables and views as a Parquet dataset, for DuckDB,
    /// Polars, pandas or Spark: DIR/TABLE/run=ID/part-0.parquet (Hive
    /// partitioning), ID the trace file's SHA-256. Appendable: a run already
    /// in DIR is refused, or with --force replaced.
    Parquet {
        /// The traces (.provm).
        #[arg(required = true, value_name = "RUN")]
        runs: Vec<PathBuf>,
        /// Also write the tables that come from replaying each run (the
        /// system calls): as long again as the runs took.
        #[arg(long)]
        with_replay: bool,
        /// Write only this table or view (again for more; default: every
        /// one, `provm query --schema` lists them).
        #[arg(long = "table", value_name = "TABLE")]
        tables: Vec<String>,
        /// The dataset's directory: made if absent, added to if not.
        #[arg(short, long, value_name = "DIR")]
        output: PathBuf,
        /// Replace the partitions of runs already in DIR.
        #[arg(long)]
        force: bool,
    },
    /// The run as a timeline in the Trace Event Format, for Perfetto
    /// (ui.perfetto.dev) or chrome://tracing: one track per guest process
    /// (with --prov), one per vCPU (with --cpus N), VM exits by device,
    /// interrupts and disk writes, and the VMM's time by device (when the
    /// trace keeps exit timing).
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
    /// start and end. Several runs (in the order they ran) make a
    /// Provenance Run Crate: each run a step, its files identified by
    /// SHA-256, so that a file one run left written and a later one read is
    /// one entity. `scripts/check-ro-crate DIR` validates either.
    RoCrate {
        #[command(flatten)]
        runs: RunsArgs,
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
pub struct ExportOutput {
    /// The file to write.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Overwrite FILE if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Subcommand)]
pub enum KernelAction {
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

fn parse_image(text: &str) -> Result<ImageRef, std::convert::Infallible> {
    Ok(ImageRef::parse(text))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Clap checks its own rules (unique argument ids, conflicts naming
    /// real arguments) only in this debug assertion; CI builds release.
    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
