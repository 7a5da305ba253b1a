//! The command line, runc's: the global options conmon, containerd's runc
//! shim and Slurm pass, and the lifecycle's commands (runtime-spec's
//! runtime.md, and runc's `run`).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "provm-runtime",
    version,
    about = "An OCI runtime whose containers run in provm's VM, each recorded into a trace that `provm replay` re-executes"
)]
pub struct Cli {
    /// Where the containers' state is kept.
    #[arg(long, global = true, default_value = "/run/provm-runtime")]
    pub root: PathBuf,
    /// Where errors and warnings go, besides standard error.
    #[arg(long, global = true)]
    pub log: Option<PathBuf>,
    #[arg(long = "log-format", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Accepted for runc's sake; a VM has no host cgroup to place.
    #[arg(long = "systemd-cgroup", global = true)]
    pub systemd_cgroup: bool,
    /// Debug lines, in the log or else on standard error: warnings, and
    /// the engine's phases with their times (the root's disk, the restore,
    /// the command, the trace).
    #[arg(long, global = true)]
    pub debug: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a container: check its bundle, make its root's disk and start
    /// its process, which waits for `start`.
    Create {
        #[command(flatten)]
        create: CreateArgs,
    },
    /// Run the created container's command.
    Start { id: String },
    /// The container's state, as runc shows it (JSON).
    State { id: String },
    /// Send the container's process a signal (default SIGTERM).
    Kill {
        /// Every process of the container (it has one on the host).
        #[arg(short, long)]
        all: bool,
        id: String,
        #[arg(default_value = "SIGTERM")]
        signal: String,
    },
    /// Forget a stopped container (`--force`: stop it first).
    Delete {
        #[arg(short, long)]
        force: bool,
        id: String,
    },
    /// Create, start and wait: exits with the command's status.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        /// Return once the command has started.
        #[arg(short, long)]
        detach: bool,
    },
    /// What this runtime supports (runtime-spec's features.md).
    Features,
    /// Not supported: a container's VM runs one command.
    #[command(disable_help_flag = true)]
    Exec {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The container's process (started by `create`, not by users).
    #[command(hide = true)]
    Init { id: String },
}

#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// The bundle: a directory holding config.json and the root.
    #[arg(short, long, default_value = ".")]
    pub bundle: PathBuf,
    /// Where the container process's PID is written.
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    /// A unix socket that gets the master of the container's terminal.
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    /// Accepted for runc's sake: a VM has no host root to pivot from.
    #[arg(long = "no-pivot")]
    pub no_pivot: bool,
    /// Accepted for runc's sake: a VM has its own keyring.
    #[arg(long = "no-new-keyring")]
    pub no_new_keyring: bool,
    pub id: String,
}
