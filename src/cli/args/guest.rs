//! The options of the commands that run a guest (`run`, `record`,
//! `repro`): the command and its machine, pinning and exit timing.

use std::ffi::OsString;
use std::path::PathBuf;

use provm::blame::TimingOptions;
use provm_cpu_model::Baseline;
use provm_engine::image::ImageRef;
use provm_engine::pinning::Pinning;
use provm_vmm::exit_timing::ExitDelay;

use super::parse_image;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Keep the overlay holding the guest's writes at this path (a qcow2
    /// whose backing file is IMAGE).
    #[arg(long, value_name = "PATH")]
    pub keep_overlay: Option<PathBuf>,
    /// Capture the command's provenance (its processes and the files they
    /// read and wrote) and write it to FILE, for `provm graph FILE`; a
    /// recording also keeps it in its trace (`provm graph TRACE`).
    #[arg(long = "prov", value_name = "FILE")]
    pub provenance: Option<PathBuf>,
    /// After the command, copy what it left at GUEST_PATH in the guest (a
    /// directory, made empty beforehand if the image lacks it, or a file) to
    /// HOST_PATH, whole or not at all (repeatable). A recording keeps it in
    /// the trace too: `provm export files` gets it back.
    #[arg(long = "output", value_name = "GUEST_PATH:HOST_PATH",
          value_parser = provm_engine::transfer::Output::parse)]
    pub outputs: Vec<provm_engine::transfer::Output>,
    /// Overwrite output files that exist (the trace, --output, --prov,
    /// --keep-overlay).
    #[arg(long)]
    pub force: bool,
    /// `run` with --cpus N: run the vCPUs one at a time, switched at VM
    /// exits, as a recording does (`record` refuses it: it always does);
    /// by default `run` runs them side by side, each on a host thread of
    /// its own, which pays on parallel work where the host has a free core
    /// for each (docs/smp.md).
    #[arg(long)]
    pub serial: bool,
    /// Give the guest a network card behind provm's NAT: the guest is
    /// 10.0.2.15, reaches the host's 127.0.0.1 as 10.0.2.2 and has a
    /// resolver at 10.0.2.3 that forwards to the host's (outbound TCP and
    /// UDP; no ICMP). A recording logs every frame the guest receives, so
    /// its replay needs no network and resolves nothing.
    #[arg(long)]
    pub net: bool,
    /// With --net: the DNS server the guest's resolver forwards to, an IP
    /// address and port (default: the first nameserver of the host's
    /// /etc/resolv.conf).
    #[arg(long, value_name = "HOST:PORT", requires = "net",
          value_parser = provm_engine::net::resolver::parse_dns)]
    pub dns: Option<std::net::SocketAddr>,
    /// Run the command on a terminal in the guest, typed at from the one
    /// provm runs in (like `docker run -it`): a shell prompts and edits
    /// lines, Ctrl-C and Ctrl-D go to the command, and the guest's
    /// terminal follows this one's size. This terminal is raw until the
    /// command ends; a recording keeps what was typed, where it came.
    #[arg(short = 't', long)]
    pub tty: bool,
    #[command(flatten)]
    pub timing: TimingArgs,
    #[command(flatten)]
    pub guest: GuestArgs,
}

/// The command and the machine it runs in: what `run`, `record` and
/// `repro` share.
#[derive(clap::Args)]
pub struct GuestArgs {
    /// Guest memory in MiB (each 128 MiB adds seconds of boot where guest
    /// ring 0 is emulated).
    #[arg(long, default_value_t = provm_engine::start::DEFAULT_MEMORY_MIB)]
    pub memory: u64,
    /// The guest's vCPUs, 1 to 64. More than one boots the SMP kernel
    /// variant (`provm kernel build --smp`). A recording runs them one at
    /// a time, switched at VM exits, and logs the schedule; `run` runs
    /// them side by side (see `run --serial`).
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u8).range(1..=i64::from(provm_vmm::mp_table::MAX_CPUS)))]
    pub cpus: u8,
    /// Give up (and stop the guest) after this many seconds.
    #[arg(long, default_value_t = provm_engine::start::DEFAULT_TIMEOUT_SECONDS)]
    pub timeout: u64,
    /// Set an environment variable for CMD (repeatable); added to a minimal
    /// default environment (PATH, HOME, LANG).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory of CMD inside the image (default: a container
    /// image's WorkingDir, else /).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Give CMD the host's file or folder HOST_PATH at GUEST_PATH, read-only
    /// (repeatable). It is copied into guest memory before CMD starts (see
    /// --memory) and hides what the image has there; a recording keeps it
    /// in the trace, so a replay needs nothing from the host.
    #[arg(long = "input", value_name = "HOST_PATH:GUEST_PATH",
          value_parser = provm_engine::transfer::Input::parse)]
    pub inputs: Vec<provm_engine::transfer::Input>,
    /// The root file system's device: /dev/vdaN, vdaN or N. By default the
    /// whole disk if it holds a file system, else the Linux root partition.
    #[arg(long)]
    pub root: Option<String>,
    /// Boot this vmlinux instead of the one `provm kernel build` made.
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    #[command(flatten)]
    pub pinning: PinningArgs,
    /// The disk image (qcow2 or raw), or a container image as skopeo names
    /// it: oci:DIR[:TAG], oci-archive:FILE[:TAG] or
    /// docker-archive:FILE[:NAME:TAG], made into a disk once and cached by
    /// its digest. Its Env, WorkingDir, User and Entrypoint/Cmd are the command's
    /// defaults.
    #[arg(value_parser = parse_image)]
    pub image: ImageRef,
    /// The command and its arguments (a container image's Entrypoint and
    /// Cmd when none is given; a command given replaces both).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(clap::Args)]
pub struct ReproArgs {
    /// How many runs with varied inputs to compare (at least 2).
    #[arg(long, default_value_t = 2, value_parser = parse_runs)]
    pub runs: usize,
    /// With --cpus N > 1: record CMD K times (at least 2) with every input
    /// pinned and the vCPU schedule drawn from chaos seeds 1 to K (`record
    /// --chaos`) instead, group the seeds by what their runs produced, and
    /// keep one trace per distinct output in --traces, to replay.
    #[arg(long, value_name = "K", conflicts_with = "runs", value_parser = parse_runs)]
    pub chaos_runs: Option<usize>,
    /// With --chaos-runs: the folder the traces go to, made if missing and
    /// empty otherwise (default: IMAGE's name and the time, .chaos, here).
    #[arg(long, value_name = "DIR", requires = "chaos_runs")]
    pub traces: Option<PathBuf>,
    /// With --chaos-runs: each recording's --exitless-limit (see `provm
    /// record`).
    #[arg(long, default_value_t = DEFAULT_EXITLESS_LIMIT, value_name = "SECONDS", requires = "chaos_runs")]
    pub exitless_limit: u64,
    #[command(flatten)]
    pub guest: GuestArgs,
}

#[derive(clap::Args)]
pub struct PinningArgs {
    /// Make the run reproducible: guest time is logical (it starts at
    /// --epoch and moves with the guest's progress, never with the host's)
    /// and the guest's entropy comes from --seed. Two pinned runs of a
    /// command on an image are the same run: same output, same event log
    /// (its SHA-256 is printed on stderr).
    #[arg(long)]
    pub pinned: bool,
    /// The pinned run's entropy seed: up to 64 hex digits.
    #[arg(long, value_name = "HEX", requires = "pinned", value_parser = provm_engine::pinning::parse_seed)]
    pub seed: Option<[u8; 32]>,
    /// The pinned run's wall-clock time at the start: RFC 3339
    /// (2000-01-01T00:00:00Z, the default) or seconds since the Unix epoch.
    #[arg(long, value_name = "TIME", requires = "pinned", value_parser = provm_engine::pinning::parse_epoch)]
    pub epoch: Option<u64>,
}

impl PinningArgs {
    pub fn pinning(&self) -> Option<Pinning> {
        let default = Pinning::default();
        self.pinned.then(|| Pinning {
            seed: self.seed.unwrap_or(default.seed),
            epoch_ns: self.epoch.unwrap_or(default.epoch_ns),
            ..default
        })
    }
}

#[derive(clap::Args)]
pub struct RecordArgs {
    /// Where to write the trace (default: IMAGE's name and the time, here).
    #[arg(short = 'o', long = "trace", value_name = "TRACE")]
    pub output: Option<PathBuf>,
    /// Embed the base image too (compressed): the trace alone replays.
    #[arg(long)]
    pub embed_image: bool,
    /// After this many seconds without a VM exit while a timer interrupt
    /// waits (0: never): stop a guest kernel that spent them going round
    /// the same register states, spinning with interrupts on (it can only
    /// get the tick at an exit; a kernel still working goes on), and warn,
    /// once, about guest user code computing (a long computation is normal).
    #[arg(long, default_value_t = DEFAULT_EXITLESS_LIMIT, value_name = "SECONDS")]
    pub exitless_limit: u64,
    /// Preempt guest code that goes round a loop it never leaves by itself
    /// (a state it comes back to, with no exit on the way), once it has
    /// run MS milliseconds without a VM exit while a timer or another vCPU
    /// waits: a thread spinning on a flag another thread sets then ends.
    /// The replay finds each preemption by its state, with a hardware
    /// breakpoint (on PVM, whose user mode stops at none, with an `int3`
    /// there).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub preempt: Option<u64>,
    /// With --preempt: preempt computations that end by themselves too, so
    /// that processes computing without system calls interleave. The
    /// replay runs freely for most of the time the recording computed
    /// before it arms the breakpoint, and rolls back where it ran past;
    /// its search can still cost a breakpoint stop per pass of a tight
    /// loop (docs/recording.md). SVM and VMX hosts.
    #[arg(long, requires = "preempt")]
    pub preempt_computations: bool,
    /// Leave the exit timing (`provm blame`) out of the trace.
    #[arg(long)]
    pub no_timing: bool,
    /// Draw the vCPU schedule (with --cpus N > 1: when each vCPU runs, for
    /// how many exits) and, with --preempt, how long each stretch without
    /// exits may compute before it is preempted (an eighth of MS to twice
    /// it) and, with --pinned, the guest time each exit takes (2.5 to 20
    /// µs instead of 10, which moves the guest's own ticks) from
    /// SEED, so that different seeds interleave the guest's threads
    /// differently. The trace replays exactly, whatever the seed.
    #[arg(long, value_name = "SEED")]
    pub chaos: Option<u64>,
    /// Name the host's files (the image and its backing files, the kernel)
    /// by their paths in the trace and its provenance, instead of by file
    /// name and digest alone: a published trace then shows your user name
    /// and directory layout.
    #[arg(long)]
    pub keep_host_paths: bool,
    /// The guest's CPU: `host`, this host's (less what provm hides), or a
    /// named baseline that keeps only that x86-64 level's features, so that
    /// the trace replays on any host that can offer it (not on PVM).
    #[arg(long, value_name = "MODEL", default_value = "host",
          value_parser = clap::builder::TypedValueParser::map(
              clap::builder::PossibleValuesParser::new(Baseline::NAMES),
              |name| name.parse::<Baseline>().expect("one of the names")))]
    pub cpu: Baseline,
    #[command(flatten)]
    pub run: RunArgs,
}

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
    #[arg(long, value_name = "DEVICE:DURATION", value_parser = provm::blame::inject::parse_exit_delay)]
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

/// `--exitless-limit`'s default, in seconds: a guest kernel spinning this
/// long is stuck.
const DEFAULT_EXITLESS_LIMIT: u64 = 60;

/// `--exitless-limit SECONDS` as a limit: none for 0.
pub fn exitless_limit(seconds: u64) -> Option<std::time::Duration> {
    (seconds > 0).then(|| std::time::Duration::from_secs(seconds))
}

/// `--runs N`: a comparison needs two runs at least.
fn parse_runs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(runs) if runs >= 2 => Ok(runs),
        _ => Err("give a number of runs of 2 or more (a comparison needs two)".into()),
    }
}
