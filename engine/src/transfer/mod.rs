//! Data in and out of the guest: the host's files and folders the command
//! reads (`--input HOST:GUEST`), its standard input, and what it leaves
//! under a guest path, copied back to the host (`--output GUEST:HOST`).
//!
//! Small inputs, standard input and outputs travel over the agent channel,
//! as tree entries (`provm_guest_agent::tree`): whatever the host sends the
//! guest is logged in a recording's trace like every other input, and
//! whatever the guest sends back is checked byte for byte by a replay. The
//! channel needs no device (the machine and its booted snapshot stay those
//! of a run without data), but it is Linux's hvc, 16 bytes per poll in the
//! guest kernel: 11 KB/s where ring 0 is emulated (PVM). So inputs of
//! `DISK_FROM` bytes or more go on the input disk (`input_disk`): a
//! reproducible ext4 image made as container images' disks are
//! (`image::ext4`), on a read-only virtio-blk device that only such runs
//! have, in a booted snapshot of its own that serves every input (the
//! device boots empty, at a fixed size). The trace embeds the image under
//! its digest, so a replay still needs no host file.
//!
//! The path of one `--input`, room by room; its data goes one way, each
//! room taking what the rooms before it made, none asking a later one:
//!
//! 1. The command line parses it (`Input::parse`, in `survey`) into
//!    `RunOptions::inputs`; `start::job_with_data` asks for the job's data
//!    (`JobData::prepare`, below) before anything is written.
//! 2. `survey`: the host path walked into plain data (entries, files,
//!    bytes), the route of all inputs chosen (by disk from `DISK_FROM`
//!    bytes) and what goes by channel checked against the guest's memory.
//!    No content is read yet.
//! 3. The route reads it, through `tree_messages`, for its digest: on the
//!    channel, `InputPlan::on_channel`; by disk, `input_disk::build`, which
//!    finds the disk in the cache (`input_identity`: nothing read) or
//!    makes it (`disk_fill`: read once, written and digested), and gives
//!    back the disk and the digests.
//! 4. `inputs`: the `InputPlan`, the survey and the digests, unchanged from
//!    then on. It gives the manifest its records (`record.rs`), the job
//!    its input paths and route (`JobData::describe`), and the session
//!    (`session.rs`) the messages that follow the job: a channel input
//!    read again and checked against its digest as it is sent.
//! 5. By disk, the machine gets the disk as its second, read-only
//!    virtio-blk device (`start::job_with_data`, `machine.rs`), from a
//!    booted snapshot that booted with it empty (`fast_start.rs`); a
//!    recording embeds it in the trace (`input_disk::embed`) and a replay
//!    takes it from the cache or the trace (`input_disk::of_trace`), where
//!    a channel input comes from the log. The guest's agent fills each
//!    input into a tmpfs, or binds it from the disk, at its guest path.

mod disk_fill;
pub mod input_disk;
mod input_identity;
pub mod inputs;
pub mod live_stdin;
pub mod outputs;
mod survey;
pub mod terminal;
mod tree_messages;

use std::path::{Path, PathBuf};

pub use input_disk::InputDisk;
pub use inputs::InputPlan;
pub use live_stdin::LiveStdin;
pub use outputs::{Delivered, Output, OutputSink};
use survey::Survey;
pub use survey::{Input, DISK_FROM};

/// A job's data: the inputs and standard input that follow it, and where
/// its outputs go.
pub struct JobData {
    pub inputs: InputPlan,
    /// The inputs' disk, when they go by disk.
    pub input_disk: Option<InputDisk>,
    /// Standard input that streams to the command as it runs, after the
    /// inputs (then `inputs` has none).
    pub live_stdin: Option<LiveStdin>,
    pub outputs: OutputSink,
}

impl JobData {
    /// Checks and surveys the data, before anything starts: a bad input or
    /// an output that exists is refused with nothing written (but to
    /// provm's cache, the input disk).
    pub fn prepare(
        inputs: &[Input],
        stdin: Option<Vec<u8>>,
        outputs: &[Output],
        force: bool,
        memory_mib: u64,
    ) -> Result<JobData, DataError> {
        let outputs = OutputSink::new(outputs, force)?;
        let survey = Survey::of(inputs, stdin, memory_mib, DISK_FROM)?;
        // The digests, from the inputs' route: read for them on the
        // channel, or taken as their disk is made (or found).
        let (inputs, input_disk) = if survey.by_disk {
            let (disk, digests) = input_disk::build(&survey.trees)?;
            (InputPlan::new(survey, digests), Some(disk))
        } else {
            (InputPlan::on_channel(survey)?, None)
        };
        Ok(JobData {
            inputs,
            input_disk,
            live_stdin: None,
            outputs,
        })
    }

    /// No data at all.
    pub fn none() -> JobData {
        Self::prepare(&[], None, &[], false, 0).expect("no data cannot be refused")
    }

    /// Tells the job what data follows it and what to send back.
    pub fn describe(&self, job: &mut provm_guest_agent::Job) {
        job.inputs = self.inputs.guest_paths();
        job.input_disk = self.inputs.by_disk();
        job.stdin = self.inputs.has_stdin();
        job.live_stdin = self.live_stdin.is_some();
        job.outputs = self.outputs.guest_paths();
    }
}

/// Puts every output in place, and says what each held.
pub fn deliver(outputs: OutputSink) -> Result<(), DataError> {
    for (output, delivered) in outputs.commit()? {
        let (guest, host) = (&output.guest, output.host.display());
        if delivered.missing {
            crate::notice!("the command left nothing at {guest}: nothing was copied to {host}");
        } else {
            crate::notice!(
                "copied {guest} to {host} ({} files, {} bytes)",
                delivered.files,
                delivered.bytes
            );
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("--input {0:?} is not of the form HOST_PATH:GUEST_PATH")]
    InputSpec(String),
    #[error("--output {0:?} is not of the form GUEST_PATH:HOST_PATH")]
    OutputSpec(String),
    #[error("{flag} {spec:?}: {problem}")]
    GuestPath {
        flag: &'static str,
        spec: String,
        problem: String,
    },
    #[error("the input {0} does not exist: check the host path before the ':'")]
    InputMissing(PathBuf),
    #[error("cannot read the input {path}: {source}; make it readable, or leave it out")]
    InputUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the input {0} is not a regular file, a directory or a symbolic link (a pipe, socket or device has no content to copy): leave it out")]
    InputSpecial(PathBuf),
    #[error("the input {0} changed while it was being sent to the guest: run again when nothing writes to it")]
    InputChanged(PathBuf),
    #[error("the inputs and standard input hold {bytes_mib} MiB, and the guest keeps them in memory, of which it can give them half: pass --memory {needed_mib} (or more)")]
    TooBigForMemory { bytes_mib: u64, needed_mib: u64 },
    #[error("the input disk: {0}")]
    InputDisk(String),
    #[error("cannot start reading the standard input: {0}")]
    LiveStdin(std::io::Error),
    #[error("two outputs go to {0}: give each its own host path")]
    OutputTwice(PathBuf),
    #[error("{0} exists; pass --force to replace it, or choose another host path for --output")]
    OutputExists(PathBuf),
    #[error("cannot write the output {path}: {source}")]
    OutputWrite {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the guest sent an output entry {0:?}, which is not part of any output: refusing to write it")]
    OutputOutside(String),
}

impl DataError {
    /// What makes an error of the input disk's at `path` (a file, or the
    /// folder being written in).
    fn input_disk_at(path: &Path) -> impl Fn(std::io::Error) -> DataError + Copy + '_ {
        move |error| DataError::InputDisk(format!("{}: {error}", path.display()))
    }
}

/// Splits `spec` at its ':' into two non-empty halves (`first` at the
/// first ':' when `at_first`, else at the last one).
fn split_spec(spec: &str, at_first: bool) -> Option<(&str, &str)> {
    let (a, b) = if at_first {
        spec.split_once(':')?
    } else {
        spec.rsplit_once(':')?
    };
    (!a.is_empty() && !b.is_empty()).then_some((a, b))
}

/// `path` (a guest path from `--input` or `--output`) without a trailing
/// '/', or the reason it cannot be one.
fn guest_path(flag: &'static str, spec: &str, path: &str) -> Result<String, DataError> {
    match provm_guest_agent::tree::guest_path_problem(path) {
        Some(problem) => Err(DataError::GuestPath {
            flag,
            spec: spec.to_owned(),
            problem,
        }),
        None => Ok(path.trim_end_matches('/').to_owned()),
    }
}
