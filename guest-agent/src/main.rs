//! provm's guest agent: PID 1 of the guest's initramfs.
//!
//! It mounts the kernel's file systems and, read-only, the image's root the
//! kernel command line names (provm.root=), says Ready on the agent channel
//! (/dev/hvc0), then runs the host's jobs: the first makes that root
//! writable (or mounts it) and chroots into it; each runs a command there,
//! streaming its output back. On PowerOff, or when the channel closes, it
//! leaves the root's file system clean and powers the guest off. PID 1
//! must never exit (the kernel would panic), so errors become Failed
//! messages or, when the agent cannot go on, a line on the console and a
//! power-off.
//!
//! The agent takes over `main` from std: started without /dev/console in the
//! initramfs, PID 1 has file descriptors 0-2 closed, and std's start-up code
//! then aborts, failing to open /dev/null in a /dev that is not mounted yet.
#![cfg_attr(not(test), no_main)]
// Every unsafe block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

mod command;
mod cpu;
mod entropy;
mod inputs;
mod limits;
mod network;
mod outputs;
mod provenance;
mod resolver;
mod root;
mod stdin_pipe;
mod terminal;
mod user;

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::{mem, panic, ptr};

use inputs::Inputs;
use provm_guest_agent::{FrameReader, GuestMessage, HostMessage, Job};
use resolver::ResolverConfig;
use root::{Mounted, Root};
use stdin_pipe::StdinPipe;

/// The agent channel: the host's virtio console.
const CHANNEL: &str = "/dev/hvc0";

/// Most bytes read from the channel at once.
const READ_SIZE: usize = 64 * 1024;

#[cfg_attr(not(test), no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // Its power-off would be the machine's: only run as a guest's init.
    // SAFETY: getpid(2) takes no arguments and cannot fail.
    if unsafe { libc::getpid() } != 1 {
        log("refusing to run: not PID 1 of a provm guest");
        return 1;
    }
    panic::set_hook(Box::new(|info| {
        log(&info.to_string());
        power_off(None)
    }));
    let mut agent = Agent::start();
    agent.serve();
    agent.power_off()
}

struct Agent {
    channel: File,
    /// What has arrived on the channel and is not yet a whole message.
    frames: FrameReader,
    /// Signals and terminal sizes for the command that came with its
    /// data, before it started.
    early_requests: Vec<HostMessage>,
    /// The initramfs's /dev/null: every command's stdin, whether or not the
    /// image has a /dev.
    null: File,
    /// The image's root, mounted read-only at boot, until a job enters it.
    premounted: Option<Mounted>,
    /// The image's root, once a job has entered it.
    root: Option<Root>,
    /// The resolver configuration the image's root gets (`--net`).
    resolver: Option<ResolverConfig>,
    /// The environment entries every command gets (`cpu::library_switches`)
    /// when user space may use vector state the guest kernel does not save;
    /// none otherwise.
    library_switches: Vec<String>,
}

impl Agent {
    /// Sets up the guest and the channel and tells the host it is Ready.
    fn start() -> Agent {
        let mounted = root::mount_api_filesystems("", true);
        open_standard_fds();
        if let Err(reason) = mounted {
            log(&reason);
        }
        if let Err(error) = network::bring_up_loopback() {
            log(&format!("cannot bring up the loopback interface: {error}"));
        }
        // What the VMM asks of the guest: the root, the network card, the
        // guest kernel's scheduling.
        let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_else(|error| {
            log(&format!("cannot read /proc/cmdline: {error}"));
            String::new()
        });
        let resolver = bring_up_network_card(&cmdline);
        let premounted = premount_root(&cmdline);
        let channel = open_channel().unwrap_or_else(|error| {
            log(&format!("cannot set up {CHANNEL}: {error}"));
            power_off(None)
        });
        let null = File::open("/dev/null").unwrap_or_else(|error| {
            log(&format!("cannot open /dev/null: {error}"));
            power_off(None)
        });
        let agent = Agent {
            channel,
            frames: FrameReader::default(),
            early_requests: Vec::new(),
            null,
            premounted,
            root: None,
            resolver,
            library_switches: library_switches(&cmdline),
        };
        agent.send(&GuestMessage::Ready);
        agent
    }

    /// Answers the host's messages until it asks for power-off or the
    /// channel closes.
    fn serve(&mut self) {
        loop {
            match self.next_message() {
                Some(Ok(HostMessage::Run(job))) => self.run(&job),
                Some(Ok(HostMessage::PowerOff)) | None => return,
                // The rest of the data of a job that failed while it came.
                Some(Ok(
                    HostMessage::Entry(_)
                    | HostMessage::Stdin(_)
                    | HostMessage::DataEnd
                    | HostMessage::StdinEnd,
                )) => {}
                // For a command that has ended.
                Some(Ok(HostMessage::Signal(_) | HostMessage::Resize(_))) => {}
                Some(Err(error)) => self.fail(format!("cannot decode the host's message: {error}")),
            }
        }
    }

    /// The host's next message, read from the channel until it has come
    /// whole; `None` when the channel closed or failed (said on the
    /// console). A corrupt stream ends the agent.
    fn next_message(&mut self) -> Option<Result<HostMessage, provm_guest_agent::DecodeError>> {
        let mut buffer = vec![0; READ_SIZE];
        loop {
            match self.frames.next_frame() {
                Ok(Some((kind, payload))) => return Some(HostMessage::decode(kind, &payload)),
                Ok(None) => match self.channel.read(&mut buffer) {
                    Ok(0) => {
                        log(&format!("{CHANNEL} closed"));
                        return None;
                    }
                    Ok(len) => self.frames.push(&buffer[..len]),
                    Err(error) => {
                        log(&format!("cannot read {CHANNEL}: {error}"));
                        return None;
                    }
                },
                // The frame boundaries are lost: nothing more can be understood.
                Err(error) => {
                    let reason = format!("corrupt stream from the host: {error}");
                    self.fail(reason.clone());
                    self.fatal(&reason);
                }
            }
        }
    }

    /// Takes the job's inputs and standard input as they come, each data
    /// message acknowledged, until DataEnd; gives the standard input.
    fn receive_data(&mut self, job: &Job) -> Result<Option<File>, String> {
        let mut inputs = Inputs::begin(job)?;
        if !inputs.come_on_channel() {
            return inputs.finish();
        }
        loop {
            match self.next_message() {
                Some(Ok(HostMessage::DataEnd)) => return inputs.finish(),
                Some(Ok(early @ (HostMessage::Signal(_) | HostMessage::Resize(_)))) => {
                    self.early_requests.push(early)
                }
                Some(Ok(message)) => {
                    inputs.take(message)?;
                    self.send(&GuestMessage::Received);
                }
                Some(Err(error)) => return Err(format!("cannot decode the host's data: {error}")),
                None => return Err("the channel closed while the job's data came".into()),
            }
        }
    }

    /// Runs `job` and reports how it ended: Finished, or Failed when it
    /// could not be run.
    fn run(&mut self, job: &Job) {
        let mut guarded;
        let job = if !self.library_switches.is_empty() {
            guarded = job.clone();
            cpu::add_library_switches(&mut guarded.env, &self.library_switches);
            &guarded
        } else {
            job
        };
        self.early_requests.clear();
        let outcome = entropy::seed(&job.entropy)
            .and_then(|()| set_wall_clock(job.wall_clock_ns))
            .and_then(|()| self.enter_root(&job.root_device, job.leave_root_clean))
            .and_then(|()| self.receive_data(job))
            .and_then(|stdin| {
                outputs::prepare(&job.outputs)?;
                // A live stdin's chunks wait on the channel until the
                // command runs, which reads them from a pipe (or from its
                // terminal, whose master takes them: `command::run`).
                let piped = job.live_stdin && job.terminal.is_none();
                let (live_stdin, stdin) = match (piped, stdin) {
                    (true, _) => {
                        let (pipe, read) = StdinPipe::new()
                            .map_err(|error| format!("cannot make the stdin pipe: {error}"))?;
                        (Some(pipe), Some(read))
                    }
                    (false, stdin) => (None, stdin),
                };
                let stdin = stdin.as_ref().unwrap_or(&self.null);
                let mut host = JobHost {
                    channel: &self.channel,
                    frames: &mut self.frames,
                    early_requests: &mut self.early_requests,
                    root: self.root.as_ref(),
                };
                let outcome = command::run(job, stdin, live_stdin, &mut host)?;
                outputs::send(&job.outputs, &mut |message| self.send(&message))?;
                Ok(outcome)
            });
        match outcome {
            Ok(outcome) => self.send(&GuestMessage::Finished(outcome)),
            Err(reason) => self.fail(reason),
        }
    }

    /// Enters the image's root on the first job (the boot's read-only mount,
    /// made writable, if it names that device); later ones must name it too.
    /// The last job says whether it is left clean at power-off.
    fn enter_root(&mut self, device: &[u8], leave_clean: bool) -> Result<(), String> {
        match &self.root {
            None => {
                self.root = Some(match self.premounted.take() {
                    Some(mounted) if mounted.device() == device => mounted.enter()?,
                    Some(mounted) => {
                        mounted.unmount().map_err(|error| {
                            format!("cannot unmount the root mounted at boot: {error}")
                        })?;
                        Root::enter(device)?
                    }
                    None => Root::enter(device)?,
                });
                if let Some(resolver) = &self.resolver {
                    resolver.bind()?;
                }
            }
            Some(root) if root.device() != device => {
                let (mounted, asked) = (root.device(), device);
                return Err(format!(
                    "the root is already mounted from {}, cannot switch to {}",
                    String::from_utf8_lossy(mounted),
                    String::from_utf8_lossy(asked)
                ));
            }
            Some(_) => {}
        }
        if let Some(root) = &mut self.root {
            root.leave_clean = leave_clean;
        }
        Ok(())
    }

    fn fail(&self, reason: String) {
        self.send(&GuestMessage::Failed(reason.into_bytes()));
    }

    /// Sends `message`; without a channel the agent is useless, so a write
    /// error powers the guest off.
    fn send(&self, message: &GuestMessage) {
        send(&self.channel, self.root.as_ref(), message);
    }

    fn fatal(&self, reason: &str) -> ! {
        log(reason);
        self.power_off()
    }

    fn power_off(&self) -> ! {
        power_off(self.root.as_ref())
    }
}

/// Sends `message` on `channel`; without a channel the agent is useless,
/// so a write error powers the guest off (with the root `root`).
fn send(channel: &File, root: Option<&Root>, message: &GuestMessage) {
    if let Err(error) = (&*channel).write_all(&message.encode()) {
        log(&format!("cannot write to {CHANNEL}: {error}"));
        power_off(root)
    }
}

/// The agent as the running command's host (`command::Host`): the channel,
/// and the signals and live stdin that come on it for the command.
struct JobHost<'a> {
    channel: &'a File,
    frames: &'a mut FrameReader,
    early_requests: &'a mut Vec<HostMessage>,
    root: Option<&'a Root>,
}

impl command::Host for JobHost<'_> {
    fn send(&mut self, message: GuestMessage) {
        send(self.channel, self.root, &message);
    }

    fn channel(&self) -> RawFd {
        self.channel.as_raw_fd()
    }

    fn messages(&mut self) -> io::Result<Vec<HostMessage>> {
        let mut messages = mem::take(self.early_requests);
        if has_bytes(self.channel)? {
            let mut buffer = vec![0; READ_SIZE];
            match (&*self.channel).read(&mut buffer)? {
                0 => return Err(io::Error::other(format!("{CHANNEL} closed"))),
                len => self.frames.push(&buffer[..len]),
            }
        }
        // The host sends nothing else while a command runs.
        while let Some((kind, payload)) = self.frames.next_frame().map_err(io::Error::other)? {
            match HostMessage::decode(kind, &payload) {
                Ok(
                    message @ (HostMessage::Signal(_)
                    | HostMessage::Resize(_)
                    | HostMessage::Stdin(_)
                    | HostMessage::StdinEnd),
                ) => messages.push(message),
                Ok(_) => log("ignored a message of the host's that came while the command ran"),
                Err(error) => log(&format!("cannot decode the host's message: {error}")),
            }
        }
        Ok(messages)
    }
}

/// Whether `file` has bytes to read now.
fn has_bytes(file: &File) -> io::Result<bool> {
    let mut fd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `fd` is one live pollfd, which poll(2) reads and writes in
    // place; a timeout of 0 does not wait.
    match unsafe { libc::poll(&mut fd, 1, 0) } {
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(fd.revents != 0),
    }
}

/// What keeps commands away from AVX state, when the CPU lets user space
/// use it but this guest kernel does not save it across context switches
/// (nothing otherwise); says so on the console once, with what protects the
/// commands and what does not. Needs /proc mounted.
fn library_switches(cmdline: &str) -> Vec<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_else(|error| {
        log(&format!("cannot read /proc/cpuinfo: {error}"));
        String::new()
    });
    let Some(xcr0) = cpu::unmanaged_vector_state(&cpuinfo) else {
        return Vec::new();
    };
    let switches = cpu::library_switches(&cpu::CpuFeatures::of_this_cpu(xcr0));
    // Kernel patch 0008's or 0011's argument, which the VMM passes for this
    // hazard. Only the command line says which was asked for: a kernel
    // without the patches (`--kernel`) ignores them.
    let asked_for = |wanted: &str| cmdline.split_whitespace().any(|arg| arg == wanted);
    let scheduling = if asked_for("provm.user_preempt=0") {
        "provm.user_preempt=0 is set, so processes are switched only at system \
         calls (kernel patch 0008) and only a signal handler that uses AVX can \
         clobber the registers of the code it interrupts"
    } else if asked_for("provm.vector_state=vmm") {
        "provm.vector_state=vmm is set, so the VMM saves and loads each process's \
         vector state at a switch (kernel patch 0011) and only a signal handler \
         that uses AVX can clobber the registers of the code it interrupts"
    } else {
        "the kernel preempts processes anywhere, so any two that use AVX can \
         corrupt each other's registers"
    };
    log(&format!(
        "the CPU lets user space use AVX state (XCR0 {xcr0:#x}) that this guest kernel \
         does not save across context switches: {scheduling}; commands get {}",
        switches.join(" ")
    ));
    switches
}

/// Mounts the image's root read-only if the kernel command line names it
/// (provm.root=) and its file system is clean; otherwise says why not on
/// the console, and the first job mounts it.
fn premount_root(cmdline: &str) -> Option<Mounted> {
    let device = cmdline
        .split_whitespace()
        .find_map(|arg| arg.strip_prefix("provm.root="))?;
    let mounted = Mounted::read_only_if_clean(device.as_bytes())
        .map_err(|reason| log(&reason))
        .ok()?;
    if let Err(error) = mounted.warm_shell() {
        log(&format!("cannot run the image's /bin/sh at boot: {error}"));
    }
    Some(mounted)
}

/// Brings up the network card as the kernel command line says, if it
/// says (`provm run --net`), and writes the configuration of the resolver
/// it names; a failure is said on the console, and the command then runs
/// without a network or without names.
fn bring_up_network_card(cmdline: &str) -> Option<ResolverConfig> {
    let configured = network::CardConfig::from_cmdline(cmdline).and_then(|config| {
        let Some(config) = config else {
            return Ok(None);
        };
        network::bring_up_card(&config)
            .map_err(|error| format!("cannot bring up the network card: {error}"))?;
        config
            .resolver
            .map(ResolverConfig::write)
            .transpose()
            .map_err(|error| format!("cannot configure the guest's resolver: {error}"))
    });
    configured.unwrap_or_else(|reason| {
        log(&reason);
        None
    })
}

/// Makes sure file descriptors 0-2 are open. The kernel opens them on
/// /dev/console only if the initramfs has that node; left closed, the
/// agent's own files would take their numbers and receive its stderr.
fn open_standard_fds() {
    for fd in 0..3 {
        // SAFETY: fcntl(2) F_GETFD only asks about descriptor `fd`; open(2)
        // gets NUL-terminated string literals, which are 'static. The descriptors
        // opened are meant to stay open for the process's life: nothing owns them.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) < 0
                && libc::open(c"/dev/console".as_ptr(), libc::O_RDWR | libc::O_NOCTTY) < 0
            {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

/// Opens the channel in raw mode: bytes pass unchanged (no echo, no line
/// editing, no CR/LF translation, no signal characters).
fn open_channel() -> io::Result<File> {
    let channel = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(CHANNEL)?;
    let fd = channel.as_raw_fd();
    // SAFETY: termios is plain data (integers and a byte array), for
    // which all-zero is a valid value; tcgetattr fills it next.
    let mut termios = unsafe { mem::zeroed() };
    // SAFETY: `fd` is the open channel, alive for the call, and
    // `termios` a local termios it may write.
    if unsafe { libc::tcgetattr(fd, &mut termios) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: cfmakeraw(3) only edits the local termios it is given.
    unsafe { libc::cfmakeraw(&mut termios) };
    // SAFETY: `fd` is the open channel and `termios` a valid termios
    // (read from it, made raw); tcsetattr(3) only reads it.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &termios) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(channel)
}

/// Sets the guest's wall clock (CLOCK_REALTIME) to the host's, sent with
/// the job.
fn set_wall_clock(ns: u64) -> Result<(), String> {
    let now = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `now` is a valid timespec for the duration of the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &now) } != 0 {
        let error = io::Error::last_os_error();
        return Err(format!("cannot set the guest's clock: {error}"));
    }
    Ok(())
}

/// Ends every other process, writes the image's root back to its disk
/// (`Root::write_back`) and powers the guest off.
fn power_off(root: Option<&Root>) -> ! {
    // SAFETY: kill(2) and waitpid(2) with a null status pointer take no
    // pointers to our memory; killing every other process is the point
    // (PID 1 is never signalled by kill(-1)).
    unsafe {
        // Processes the commands left behind would keep the root busy.
        libc::kill(-1, libc::SIGKILL);
        while libc::waitpid(-1, ptr::null_mut(), 0) > 0 {}
    }
    if let Some(root) = root {
        if let Err(error) = root.write_back() {
            log(&format!("cannot remount the root read-only: {error}"));
            // Written back at least, if not clean.
            // SAFETY: sync(2) takes no arguments.
            unsafe { libc::sync() };
        }
    }
    // SAFETY: reboot(2) takes no pointers; powering off is the intent,
    // with the root's file system written back (it returns only on failure).
    unsafe { libc::reboot(libc::RB_POWER_OFF) };
    log(&format!("cannot power off: {}", io::Error::last_os_error()));
    // Returning would end PID 1 and panic the kernel.
    loop {
        // SAFETY: pause(2) takes no arguments; it only blocks.
        unsafe { libc::pause() };
    }
}

/// Writes a line to the console (stderr), for whoever watches the guest.
fn log(message: &str) {
    let _ = writeln!(io::stderr(), "provm-guest-agent: {message}");
}
