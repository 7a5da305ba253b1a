//! What a run asks for (`provm run`, `provm record`, a container's
//! `start`): the image and the command, the machine, the data in and out.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use provm_cpu_model::Baseline;
use provm_guest_agent::{Rlimit, WindowSize};

use crate::disk::overlay::OverlayLocation;
use crate::host_paths::HostPaths;
use crate::image::Container;
use crate::pinning::Pinning;
use crate::transfer::{DataError, Input, JobData, LiveStdin, Output};

pub const DEFAULT_MEMORY_MIB: u64 = 128;
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 3600;

#[derive(Clone)]
pub struct RunOptions {
    /// The disk the guest boots (for a container image, the disk made of
    /// it: see `crate::image`).
    pub image: PathBuf,
    /// The container image `image` was made of, if it was.
    pub container: Option<Container>,
    pub command: Vec<OsString>,
    pub env: Vec<String>,
    pub cwd: String,
    /// Who the command runs as, `USER[:GROUP]` (a container image's
    /// `User`); `None`: root.
    pub user: Option<String>,
    /// The guest's host name for the command (a container's `hostname`);
    /// `None`: the guest's own.
    pub hostname: Option<String>,
    /// Resource limits the command starts with (a container's `rlimits`).
    pub rlimits: Vec<Rlimit>,
    pub root: Option<String>,
    pub keep_overlay: Option<PathBuf>,
    /// The kept overlay's reader replays its file system's journal itself
    /// (the runtime's write-back reads it with ext4-view), rather than
    /// mounting or checking it as a disk (`--keep-overlay`): the guest then
    /// only syncs its root at power-off, not remounting it read-only to
    /// leave it clean, a remount that cost 0.2 s of guest time on PVM.
    pub overlay_reader_replays_journal: bool,
    pub memory_mib: u64,
    pub timeout: Duration,
    pub kernel: Option<PathBuf>,
    pub echo_console: bool,
    /// Logical time and seeded entropy instead of the host's (`--pinned`).
    pub pinned: Option<Pinning>,
    /// The guest's CPU model (`provm record --cpu`).
    pub cpu: Baseline,
    /// How the trace and the provenance name the host's files.
    pub host_paths: HostPaths,
    /// The host's files and folders the command gets (`--input`).
    pub inputs: Vec<Input>,
    /// The command's standard input, sent whole before it starts; `None`:
    /// /dev/null, unless `live_stdin`.
    pub stdin: Option<Vec<u8>>,
    /// provm's own standard input (a pipe, a socket) streams to the
    /// command as it runs, instead.
    pub live_stdin: bool,
    /// The command runs on a terminal of this size in the guest (a
    /// container's `process.terminal`), typed at through the live standard
    /// input; `None`: on pipes.
    pub terminal: Option<WindowSize>,
    /// What comes back to the host after the command (`--output`).
    pub outputs: Vec<Output>,
    /// Replace outputs that exist on the host.
    pub force_outputs: bool,
    /// A network card behind provm's NAT (`--net`); none by default.
    pub net: bool,
    /// Where the guest's resolver forwards (`--dns`); by default the
    /// host's resolver.
    pub dns: Option<std::net::SocketAddr>,
    /// The guest's vCPUs (`--cpus`, 1 to `MAX_CPUS`).
    pub cpus: u8,
    /// Whether they run side by side where nothing is recorded (`run`
    /// without `--serial` or `--pinned`); one at a time otherwise.
    pub parallel: bool,
}

impl RunOptions {
    /// Options with provm's defaults: `/` as the working directory, the
    /// built kernel, the default environment.
    pub fn new(image: PathBuf, command: Vec<OsString>) -> Self {
        RunOptions {
            image,
            container: None,
            command,
            env: Vec::new(),
            cwd: "/".into(),
            user: None,
            hostname: None,
            rlimits: Vec::new(),
            root: None,
            keep_overlay: None,
            overlay_reader_replays_journal: false,
            memory_mib: DEFAULT_MEMORY_MIB,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECONDS),
            kernel: None,
            echo_console: false,
            pinned: None,
            cpu: Baseline::Host,
            host_paths: HostPaths::default(),
            inputs: Vec::new(),
            stdin: None,
            live_stdin: false,
            terminal: None,
            outputs: Vec::new(),
            force_outputs: false,
            net: false,
            dns: None,
            cpus: 1,
            parallel: false,
        }
    }

    /// The job's data, checked: nothing has been written yet (a live
    /// standard input starts being read).
    pub fn job_data(&self) -> Result<JobData, DataError> {
        let mut data = JobData::prepare(
            &self.inputs,
            self.stdin.clone(),
            &self.outputs,
            self.force_outputs,
            self.memory_mib,
        )?;
        if self.live_stdin {
            data.live_stdin = Some(LiveStdin::start().map_err(DataError::LiveStdin)?);
        }
        Ok(data)
    }

    /// Where the run's overlay goes: kept where the user asked, else a
    /// temporary file removed with the VM.
    pub fn overlay_location(&self) -> OverlayLocation {
        match &self.keep_overlay {
            Some(path) => OverlayLocation::Keep(path.clone()),
            None => OverlayLocation::temporary(),
        }
    }
}
