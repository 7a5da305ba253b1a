//! A booted guest and its agent: the host side of the agent protocol.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use provm_analysis::guest::Guest;

use provm_guest_agent::{
    DecodeError, FrameReader, GuestMessage, HostMessage, Job, Outcome, ProvRecord, WindowSize,
};
use provm_seams::{HostRequests, NO_HOST_REQUESTS};
use provm_vmm::vm::{BootSource, Vm, VmConfig, VmError, VmEvent, VmSnapshot};

use crate::transfer::{DataError, JobData};

/// How many console lines an error report shows.
const CONSOLE_LINES: usize = 25;

/// How many data messages (inputs, standard input) may be on their way to
/// the agent before it acknowledges them: enough to keep the channel busy,
/// few enough that the host and the VMM's queue hold little of the data.
const DATA_WINDOW: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{error}\n--- last lines of the guest console ---\n{console}")]
    Guest { error: GuestError, console: String },
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("cannot write the command's output: {0}")]
    Output(std::io::Error),
    #[error(transparent)]
    Data(#[from] DataError),
}

/// What went wrong inside the guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// The VM stopped with an error; `running` names the guest task that was
    /// on the CPU, when the kernel's structures could be read. Boxed: this
    /// path is rare, and every `RunError` would otherwise grow.
    #[error("{error}{}", running.as_ref().map(|task| format!("; the task on the CPU: {task}")).unwrap_or_default())]
    Vm {
        error: Box<VmError>,
        running: Option<String>,
    },
    #[error("the guest kernel reset the machine (a kernel panic, or a reboot)")]
    Reset,
    #[error("the guest halted before the agent finished")]
    Halted,
    #[error("the guest agent sent a malformed message: {0}")]
    Protocol(DecodeError),
    #[error("the guest agent could not run the command: {0}")]
    AgentFailed(String),
    #[error("the guest agent sent {0:?} out of turn")]
    OutOfTurn(GuestMessage),
}

pub struct GuestSession {
    vm: Vm,
    frames: FrameReader,
    deadline: Instant,
    /// Provenance records of the jobs run so far that asked for them.
    provenance: Vec<ProvRecord>,
    /// The wall-clock time jobs carry (a pinned run's epoch); `None`: the
    /// host's when each is sent.
    pinned_wall_clock_ns: Option<u64>,
    /// The guest's vmlinux, whose symbols and profile name the running task
    /// in an error report (read only then: parsing it costs ~0.1 s).
    kernel: PathBuf,
    /// Where the signals for the command come from, and word of its live
    /// standard input (a recording's requests: its recorder stops the
    /// guest while either is due).
    requests: &'static HostRequests,
}

impl GuestSession {
    /// Boots the guest and waits for its agent; returns the session and how
    /// long the boot took.
    pub fn boot(
        config: VmConfig,
        boot: &BootSource,
        deadline: Instant,
    ) -> Result<(Self, Duration), SessionError> {
        let start = Instant::now();
        let mut session = Self::resume(Vm::new(config, boot)?, deadline, &boot.kernel);
        match session.next_message()? {
            GuestMessage::Ready => Ok((session, start.elapsed())),
            other => Err(session.guest_error(GuestError::OutOfTurn(other))),
        }
    }

    /// A session on a VM restored from a snapshot taken after Ready, whose
    /// guest runs the kernel `kernel`.
    pub fn resume(vm: Vm, deadline: Instant, kernel: &Path) -> Self {
        GuestSession {
            vm,
            frames: FrameReader::default(),
            deadline,
            provenance: Vec::new(),
            pinned_wall_clock_ns: None,
            kernel: kernel.to_owned(),
            requests: &NO_HOST_REQUESTS,
        }
    }

    /// Sends the command the signals `requests` asks for, and its live
    /// standard input as `requests` hears of it, where its recorder stops
    /// the guest for them (`HostRequests`).
    pub fn signal_command_as(&mut self, requests: &'static HostRequests) {
        self.requests = requests;
    }

    /// Jobs carry `epoch_ns` as the guest's wall-clock time, not the host's.
    pub fn pin_wall_clock(&mut self, epoch_ns: u64) {
        self.pinned_wall_clock_ns = Some(epoch_ns);
    }

    /// The VM's state, between jobs.
    pub fn snapshot(&mut self) -> Result<VmSnapshot, SessionError> {
        Ok(self.vm.snapshot()?)
    }

    /// The last lines the guest wrote to its serial console.
    pub fn console_tail(&self) -> String {
        self.vm.console_tail(CONSOLE_LINES)
    }

    /// Runs one command with no data in or out (but its output streams).
    pub fn run(
        &mut self,
        job: Job,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<Outcome, SessionError> {
        self.run_with_data(job, &mut JobData::none(), stdout, stderr)
    }

    /// Runs one command: sends it `data`'s inputs, then its live standard
    /// input as it comes, streams its output, takes the outputs it sends
    /// back into `data`, and returns how it ended.
    pub fn run_with_data(
        &mut self,
        mut job: Job,
        data: &mut JobData,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<Outcome, SessionError> {
        data.describe(&mut job);
        // The host's time as the job leaves: part of the job's bytes, so a
        // recording logs it and a replay sends the same.
        job.wall_clock_ns = self.pinned_wall_clock_ns.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() as u64)
        });
        self.vm.send_to_agent(&HostMessage::Run(job).encode());
        let mut sending = (!data.inputs.is_empty()).then(|| data.inputs.messages());
        let mut live_stdin = data
            .live_stdin
            .as_ref()
            .map(|stdin| stdin.feed(self.requests));
        let mut in_flight = 0;
        loop {
            // Keep the window full; after the last message, DataEnd.
            while let Some(messages) = sending.as_mut().filter(|_| in_flight < DATA_WINDOW) {
                match messages.next().transpose()? {
                    Some(message) => {
                        self.vm.send_to_agent(&message.encode());
                        in_flight += 1;
                    }
                    None => {
                        self.vm.send_to_agent(&HostMessage::DataEnd.encode());
                        sending = None;
                    }
                }
            }
            // The live standard input, after the inputs, in the same window.
            if let Some(feed) = live_stdin.as_mut().filter(|_| sending.is_none()) {
                for message in feed.messages(DATA_WINDOW - in_flight) {
                    in_flight += usize::from(matches!(message, HostMessage::Stdin(_)));
                    self.vm.send_to_agent(&message.encode());
                }
            }
            // Stopped for standard input that came: sent above, next round.
            let Some(message) = self.next_event()? else {
                continue;
            };
            match message {
                GuestMessage::Received if in_flight > 0 => in_flight -= 1,
                GuestMessage::Entry(entry) => data.outputs.take(entry)?,
                GuestMessage::Stdout(bytes) => write_now(stdout, &bytes)?,
                GuestMessage::Stderr(bytes) => write_now(stderr, &bytes)?,
                GuestMessage::Provenance(records) => self.provenance.extend(records),
                GuestMessage::Finished(outcome) => return Ok(outcome),
                GuestMessage::Failed(reason) => {
                    let reason = String::from_utf8_lossy(&reason).into_owned();
                    return Err(self.guest_error(GuestError::AgentFailed(reason)));
                }
                other @ (GuestMessage::Ready | GuestMessage::Received) => {
                    return Err(self.guest_error(GuestError::OutOfTurn(other)))
                }
            }
        }
    }

    /// The provenance records received since the last call (a job whose
    /// `provenance` was set sends them before it finishes).
    pub fn take_provenance(&mut self) -> Vec<ProvRecord> {
        std::mem::take(&mut self.provenance)
    }

    /// Asks the agent to sync and power off, and waits for the guest to halt,
    /// so that everything it wrote has reached the disk.
    pub fn power_off(&mut self) -> Result<(), SessionError> {
        self.vm.send_to_agent(&HostMessage::PowerOff.encode());
        loop {
            match self.vm.run(self.deadline) {
                Ok(VmEvent::Halted) => return Ok(()),
                // Late output (none is expected) does not stop the power-off;
                // a session sets no breakpoints and asks no pause, so
                // neither comes.
                Ok(VmEvent::AgentOutput(_) | VmEvent::DebugStop(_) | VmEvent::Paused) => {}
                Ok(VmEvent::Reset) => return Err(self.guest_error(GuestError::Reset)),
                // The command has ended: nothing is left to signal, size
                // or feed.
                Err(VmError::Stopped(_))
                    if self.requests.take_signal().is_some()
                        | self.requests.take_resize().is_some()
                        | self.requests.take_stdin() => {}
                Err(error) => return Err(self.vm_error(error)),
            }
        }
    }

    /// The next whole message from the agent, running the guest until it comes.
    fn next_message(&mut self) -> Result<GuestMessage, SessionError> {
        loop {
            if let Some(message) = self.next_event()? {
                return Ok(message);
            }
        }
    }

    /// The next whole message from the agent, running the guest until it
    /// comes; `None` when the guest stopped for standard input that came.
    fn next_event(&mut self) -> Result<Option<GuestMessage>, SessionError> {
        loop {
            match self.frames.next_frame() {
                Ok(Some((kind, payload))) => {
                    return GuestMessage::decode(kind, &payload)
                        .map(Some)
                        .map_err(|error| self.guest_error(GuestError::Protocol(error)))
                }
                Ok(None) => {}
                Err(error) => return Err(self.guest_error(GuestError::Protocol(error))),
            }
            match self.vm.run(self.deadline) {
                Ok(VmEvent::AgentOutput(bytes)) => self.frames.push(&bytes),
                Ok(VmEvent::DebugStop(_) | VmEvent::Paused) => {}
                Ok(VmEvent::Halted) => return Err(self.guest_error(GuestError::Halted)),
                Ok(VmEvent::Reset) => return Err(self.guest_error(GuestError::Reset)),
                // Stopped for a signal to the command, its terminal's size,
                // or standard input: the recorder logs what is sent here,
                // as the host's input.
                Err(VmError::Stopped(reason)) => {
                    let signal = self.requests.take_signal();
                    // `kill` takes signals 1 to SIGRTMAX (64) only.
                    if let Some(signal) = signal.and_then(|signal| u8::try_from(signal).ok()) {
                        self.vm.send_to_agent(&HostMessage::Signal(signal).encode());
                    }
                    let resize = self.requests.take_resize();
                    if let Some((rows, columns)) = resize {
                        let size = WindowSize { rows, columns };
                        self.vm.send_to_agent(&HostMessage::Resize(size).encode());
                    }
                    if self.requests.take_stdin() {
                        return Ok(None);
                    }
                    if signal.is_none() && resize.is_none() {
                        return Err(self.vm_error(VmError::Stopped(reason)));
                    }
                }
                Err(error) => return Err(self.vm_error(error)),
            }
        }
    }

    /// A VM error, with the guest task that was running when it came.
    fn vm_error(&self, error: VmError) -> SessionError {
        let running = self.running_task();
        self.guest_error(GuestError::Vm {
            error: Box::new(error),
            running,
        })
    }

    /// The guest task on the CPU, read from the kernel's structures
    /// (`current_task`); `None` when the kernel's symbols, its profile or
    /// the task cannot be read.
    fn running_task(&self) -> Option<String> {
        let kernel = crate::kernel_info::load(&self.kernel).ok()?;
        let view = self.vm.view().ok()?;
        let guest = Guest::new(&view, &kernel);
        let task = guest.task(guest.current_task().ok()?).ok()?;
        Some(if task.pid == 0 {
            "none (the idle task: the guest was waiting)".into()
        } else {
            format!(
                "pid {} `{}` (thread {}, parent {})",
                task.pid, task.comm, task.tid, task.ppid
            )
        })
    }

    fn guest_error(&self, error: GuestError) -> SessionError {
        let mut console = self.console_tail();
        if console.trim().is_empty() {
            console =
                "(nothing: the kernel boots quietly, printing only its warnings and errors)".into();
        }
        SessionError::Guest { error, console }
    }
}

fn write_now(out: &mut dyn Write, bytes: &[u8]) -> Result<(), SessionError> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(SessionError::Output)
}
