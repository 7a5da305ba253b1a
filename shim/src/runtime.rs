//! provm-runtime's command line, as containerd's runc shim uses runc's:
//! each call a process, its failure the error its log names. The
//! containers' state is kept in the bundle, so that each container's is
//! removed with it and no folder is shared between containerds.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::stdio::Streams;

/// The runtime's program: beside the shim's, as both are installed, or on
/// the PATH.
const PROGRAM: &str = "provm-runtime";

pub struct Runtime {
    program: PathBuf,
    root: PathBuf,
    log: PathBuf,
}

impl Runtime {
    /// The runtime for the containers of `bundle`.
    pub fn for_bundle(bundle: &Path) -> Runtime {
        let beside = std::env::current_exe()
            .map(|shim| shim.with_file_name(PROGRAM))
            .ok()
            .filter(|program| program.exists());
        Runtime {
            program: beside.unwrap_or_else(|| PathBuf::from(PROGRAM)),
            root: bundle.join("provm-runtime"),
            log: bundle.join("log.json"),
        }
    }

    /// `create`: the container's process, given `streams` (and, with
    /// `console_socket`, a terminal whose master goes there), waits for
    /// `start`; its PID.
    pub fn create(
        &self,
        id: &str,
        bundle: &Path,
        streams: Streams,
        console_socket: Option<&Path>,
    ) -> Result<i32, String> {
        let pid_file = bundle.join("init.pid");
        let mut command = self.command();
        command
            .arg("create")
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(&pid_file);
        if let Some(socket) = console_socket {
            command.arg("--console-socket").arg(socket);
        }
        command
            .arg(id)
            .stdin(streams.stdin)
            .stdout(streams.stdout)
            .stderr(streams.stderr);
        // Its standard error is the container's: the error is in the log.
        self.run(command, "create")?;
        let pid = std::fs::read_to_string(&pid_file)
            .map_err(|error| format!("cannot read {}: {error}", pid_file.display()))?;
        pid.trim()
            .parse()
            .map_err(|_| format!("{} holds no PID: {pid:?}", pid_file.display()))
    }

    pub fn start(&self, id: &str) -> Result<(), String> {
        self.quiet(&["start", id], "start").map(drop)
    }

    /// The container's status as `state` shows it: created, running or
    /// stopped.
    pub fn status(&self, id: &str) -> Result<String, String> {
        let shown = self.quiet(&["state", id], "state")?;
        let state: serde_json::Value = serde_json::from_slice(&shown)
            .map_err(|error| format!("provm-runtime state: not JSON: {error}"))?;
        Ok(state["status"].as_str().unwrap_or("unknown").to_owned())
    }

    pub fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), String> {
        let signal = signal.to_string();
        let args = match all {
            true => vec!["kill", "--all", id, &signal],
            false => vec!["kill", id, &signal],
        };
        self.quiet(&args, "kill").map(drop)
    }

    pub fn delete(&self, id: &str, force: bool) -> Result<(), String> {
        let args = match force {
            true => vec!["delete", "--force", id],
            false => vec!["delete", id],
        };
        self.quiet(&args, "delete").map(drop)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&self.log)
            .args(["--log-format", "json"]);
        command
    }

    /// Runs `args` with no input, its output and standard error kept.
    fn quiet(&self, args: &[&str], name: &str) -> Result<Vec<u8>, String> {
        let mut command = self.command();
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.run(command, name)
    }

    /// Runs `command`; its output, or the error it logged.
    fn run(&self, mut command: Command, name: &str) -> Result<Vec<u8>, String> {
        let logged = std::fs::metadata(&self.log).map_or(0, |log| log.len());
        let output = command.output().map_err(|error| {
            format!(
                "cannot run {}: {error}; install provm-runtime beside the shim or on the PATH",
                self.program.display()
            )
        })?;
        if output.status.success() {
            return Ok(output.stdout);
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(match self.errors_since(logged) {
            Some(error) => format!("provm-runtime {name}: {error}"),
            None if !stderr.trim().is_empty() => stderr.trim().to_owned(),
            None => format!("provm-runtime {name} failed ({})", output.status),
        })
    }

    /// The errors the runtime logged after the log's first `offset` bytes.
    fn errors_since(&self, offset: u64) -> Option<String> {
        let mut text = String::new();
        let mut log = std::fs::File::open(&self.log).ok()?;
        log.seek(SeekFrom::Start(offset)).ok()?;
        log.read_to_string(&mut text).ok()?;
        let errors: Vec<String> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["level"] == "error")
            .filter_map(|line| line["msg"].as_str().map(str::to_owned))
            .collect();
        (!errors.is_empty()).then(|| errors.join("; "))
    }
}
