//! Runs a job's command: spawns it, forwards its output, reports its outcome.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::{env, fs, ptr};

use provm_guest_agent::{provenance_messages, GuestMessage, HostMessage, Job, Outcome};

use crate::provenance;
use crate::stdin_pipe::StdinPipe;
use crate::terminal::Terminal;

/// Most bytes read from a pipe at once, each read sent as one frame: the
/// channel's writes are system calls, slow in the emulated guest kernel, so
/// fewer and larger is better. (A pipe holds 64 KiB by default.)
const CHUNK: usize = 64 * 1024;

/// The host while the command runs: it takes the command's output, and may
/// ask for signals to the command (a container runtime's `kill`) and send
/// its live standard input, which come on the agent channel.
pub trait Host {
    fn send(&mut self, message: GuestMessage);
    /// The channel's descriptor, polled beside the command's output.
    fn channel(&self) -> RawFd;
    /// The host's messages for the command (Signal, Stdin, StdinEnd) since
    /// the last call, reading the channel only if it has bytes waiting;
    /// `Err` when the channel has closed or failed.
    fn messages(&mut self) -> io::Result<Vec<HostMessage>>;
}

/// Runs `job` in the current root with `stdin` as its standard input, passing
/// each piece of its output to `host` as it arrives, then its provenance if
/// the job asked for it, and the signals the host asks for meanwhile to the
/// command; the host's live standard input goes to `live_stdin`, whose
/// pipe `stdin` then reads. `Err` is a reason the command could not be
/// run, for a `Failed` message.
pub fn run(
    job: &Job,
    stdin: &File,
    mut live_stdin: Option<StdinPipe>,
    host: &mut impl Host,
) -> Result<Outcome, String> {
    let (program, args) = job.argv.split_first().ok_or("the job has an empty argv")?;
    reap_orphans();
    // The agent's own directory is the command's: spawn() would report a
    // missing one like a missing program.
    let cwd = working_dir(&job.cwd);
    env::set_current_dir(&cwd).map_err(|error| {
        format!(
            "cannot enter the working directory {}: {error}",
            cwd.display()
        )
    })?;
    let env = environment(&job.env)?;
    let ids = crate::user::ids(&job.user)?;
    crate::limits::set_hostname(&job.hostname)?;
    // Held until the command is spawned, which inherits them.
    let limited = crate::limits::set(&job.rlimits)?;
    let not_started = |error: io::Error| {
        let program = String::from_utf8_lossy(program);
        spawn_failure(&error).ok_or_else(|| format!("cannot run {program}: {error}"))
    };
    let output_error = |error| format!("cannot read the command's output: {error}");
    let terminal_error = |error| format!("cannot make the command's terminal: {error}");
    let mut terminal = job
        .terminal
        .map(Terminal::open)
        .transpose()
        .map_err(terminal_error)?;
    if let (Some(terminal), true) = (&terminal, job.live_stdin) {
        live_stdin = Some(terminal.input().map_err(terminal_error)?);
    }
    let program = OsStr::from_bytes(program);
    let command_of = |program: &OsStr| -> Result<Command, String> {
        let mut command = command(program, args, &env);
        match &terminal {
            Some(terminal) => terminal.attach(&mut command).map_err(terminal_error)?,
            None => {
                let stdin = stdin
                    .try_clone()
                    .map_err(|error| format!("cannot duplicate the standard input: {error}"))?;
                command
                    .stdin(stdin)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
            }
        }
        if let Some((uid, gid)) = ids {
            command.uid(uid).gid(gid);
        }
        Ok(command)
    };
    if job.provenance {
        let traced = provenance::spawn(command_of(program)?);
        drop(limited);
        let mut traced = match traced {
            Ok(traced) => traced,
            Err(error) => return not_started(error),
        };
        let outputs = (traced.stdout.take(), traced.stderr.take());
        let streams = (live_stdin.as_mut(), terminal.as_mut());
        forward(outputs, traced.pid, streams, host).map_err(output_error)?;
        let (outcome, records) = traced
            .finish()
            .map_err(|error| format!("cannot trace the command: {error}"))?;
        provenance_messages(records)
            .into_iter()
            .for_each(|message| host.send(message));
        return Ok(outcome);
    }
    let child = spawn(program, search_path(&env), command_of)?;
    drop(limited);
    let mut child = match child {
        Ok(child) => child,
        Err(error) => return not_started(error),
    };
    let outputs = (child.stdout.take(), child.stderr.take());
    let streams = (live_stdin.as_mut(), terminal.as_mut());
    forward(outputs, child.id(), streams, host).map_err(output_error)?;
    reap(child.id()).map_err(|error| format!("cannot wait for the command: {error}"))
}

/// Spawns the command `command_of` makes for `program`, found in
/// `search_path` first if it is a bare name (see `find_in_path`).
fn spawn(
    program: &OsStr,
    search_path: Option<&OsStr>,
    command_of: impl Fn(&OsStr) -> Result<Command, String>,
) -> Result<io::Result<Child>, String> {
    if let Some(found) = find_in_path(program, search_path) {
        match command_of(found.as_os_str())?.arg0(program).spawn() {
            // A script without a #! line: execvp(3), below, runs it with
            // /bin/sh; posix_spawn does not.
            Err(error) if error.raw_os_error() == Some(libc::ENOEXEC) => {}
            spawned => return Ok(spawned),
        }
    }
    Ok(command_of(program)?.spawn())
}

/// The job's working directory; a relative one starts at the root (not at
/// the previous job's directory).
fn working_dir(cwd: &[u8]) -> PathBuf {
    Path::new("/").join(OsStr::from_bytes(cwd))
}

/// The job's environment entries, split into keys and values.
fn environment(env: &[Vec<u8>]) -> Result<Vec<(&OsStr, &OsStr)>, String> {
    env.iter()
        .map(|entry| {
            env_entry(entry).ok_or_else(|| {
                let entry = String::from_utf8_lossy(entry);
                format!("environment entry {entry:?} has no '='")
            })
        })
        .collect()
}

/// The command, with exactly the environment `env` (whose PATH is the one
/// a bare `program` is looked up in); its standard streams are set apart.
fn command(program: &OsStr, args: &[Vec<u8>], env: &[(&OsStr, &OsStr)]) -> Command {
    let mut command = Command::new(program);
    command
        .args(args.iter().map(|arg| OsStr::from_bytes(arg)))
        .env_clear()
        .envs(env.iter().copied());
    command
}

/// What the agent reads the spawned command's output from: its two pipes,
/// or its terminal's master, the agent's slave then closed.
fn outputs(
    terminal: Option<&mut Terminal>,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
) -> io::Result<[Option<File>; 2]> {
    Ok(match terminal {
        Some(terminal) => {
            terminal.spawned();
            [Some(terminal.output()?), None]
        }
        None => [
            stdout.map(|pipe| File::from(OwnedFd::from(pipe))),
            stderr.map(|pipe| File::from(OwnedFd::from(pipe))),
        ],
    })
}

/// The PATH `env` sets (its last, as for the environment a command gets).
fn search_path<'a>(env: &[(&OsStr, &'a OsStr)]) -> Option<&'a OsStr> {
    env.iter()
        .rev()
        .find_map(|&(key, value)| (key == "PATH").then_some(value))
}

/// Where execvp(3) would find a bare `program` in `search_path`: the first
/// entry holding an executable file of that name. `None` for a name with a
/// slash, or one not found, which the spawn then tries and reports as
/// before.
///
/// Found here, the command is spawned by std with posix_spawn (a vfork),
/// not with fork and execvp, which std needs when the child's PATH is not
/// the agent's. A fork copies the agent's page tables and then every page
/// either side writes: 0.2 s of each job where guest ring 0 is emulated.
/// By hand rather than with the `which` crate: the agent must stay small
/// (the guest kernel copies its bytes at every boot), and this is all of
/// it that it needs.
fn find_in_path(program: &OsStr, search_path: Option<&OsStr>) -> Option<PathBuf> {
    if program.is_empty() || program.as_bytes().contains(&b'/') {
        return None;
    }
    search_path?
        .as_bytes()
        .split(|&byte| byte == b':')
        // An empty entry is the working directory, as for execvp.
        .map(|dir| Path::new(OsStr::from_bytes(if dir.is_empty() { b"." } else { dir })))
        .map(|dir| dir.join(program))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|file| file.is_file() && file.permissions().mode() & 0o111 != 0)
        })
}

/// Splits a `KEY=VALUE` entry at its first '='.
fn env_entry(entry: &[u8]) -> Option<(&OsStr, &OsStr)> {
    let equals = entry.iter().position(|&byte| byte == b'=')?;
    let (key, value) = (&entry[..equals], &entry[equals + 1..]);
    Some((OsStr::from_bytes(key), OsStr::from_bytes(value)))
}

/// The outcome a shell would give a command that failed to start, by the
/// exec error (127 not found, 126 not executable); `None` when the failure
/// is not the program's (out of memory, too many processes...).
fn spawn_failure(error: &io::Error) -> Option<Outcome> {
    match error.raw_os_error()? {
        libc::ENOENT | libc::ENOTDIR => Some(Outcome::NotFound),
        libc::EACCES | libc::EPERM | libc::ENOEXEC | libc::EISDIR | libc::ETXTBSY => {
            Some(Outcome::NotExecutable)
        }
        _ => None,
    }
}

/// One of the command's output pipes (`None` once at end of file) and the
/// message that carries its bytes.
type Output = (Option<File>, fn(Vec<u8>) -> GuestMessage);

/// Passes the command's output (its pipes', or its terminal's) to `host`
/// as it arrives, each stream in its own message, until both are at end of
/// file and the command `pid` has exited, the signals the host asks for
/// meanwhile to the command, its live standard input to `stdin`, and its
/// terminal's sizes to `terminal`.
fn forward(
    (stdout, stderr): (Option<ChildStdout>, Option<ChildStderr>),
    pid: u32,
    (mut stdin, mut terminal): (Option<&mut StdinPipe>, Option<&mut Terminal>),
    host: &mut impl Host,
) -> io::Result<()> {
    let [stdout, stderr] = outputs(terminal.as_deref_mut(), stdout, stderr)?;
    let terminal = terminal.as_deref();
    let mut outputs: [Output; 2] = [
        (stdout, GuestMessage::Stdout),
        (stderr, GuestMessage::Stderr),
    ];
    // Readable once the command has exited: until then the host may signal
    // it, though it has closed its output. None where the kernel has no
    // pidfd (a `--kernel` before Linux 5.3): signals then end with the output.
    let mut running = pidfd(pid);
    let mut channel = host.channel();
    // Those that came before the command started.
    channel = take_messages(pid, host, channel, (stdin.as_deref_mut(), terminal))?;
    let mut buffer = vec![0; CHUNK];
    while outputs.iter().any(|(pipe, _)| pipe.is_some()) || running.is_some() {
        let [stdout, stderr] = outputs
            .each_ref()
            .map(|(pipe, _)| pipe.as_ref().map_or(-1, AsRawFd::as_raw_fd));
        let exited = running.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        let room = stdin.as_ref().map_or(-1, |pipe| pipe.fd());
        // poll() skips negative descriptors.
        let mut fds = [stdout, stderr, channel, exited, room].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        fds[4].events = libc::POLLOUT;
        // No EINTR to retry: the agent has no signal handlers.
        // SAFETY: `fds` is a live, exclusively borrowed array of
        // `fds.len()` pollfd entries, which poll(2) reads and writes in place.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) } < 0 {
            return Err(io::Error::last_os_error());
        }
        for ((pipe, message), fd) in outputs.iter_mut().zip(&fds) {
            if fd.revents == 0 {
                continue;
            }
            if let Some(file) = pipe {
                match file.read(&mut buffer) {
                    // A terminal's master says EIO once its slaves have
                    // all closed: its end of file.
                    Ok(0) => *pipe = None,
                    Err(error) if error.raw_os_error() == Some(libc::EIO) => *pipe = None,
                    // Non-blocking where the live input writes to the same
                    // master: nothing more now.
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    Err(error) => return Err(error),
                    Ok(len) => host.send(message(buffer[..len].to_vec())),
                }
            }
        }
        if fds[2].revents != 0 {
            channel = take_messages(pid, host, channel, (stdin.as_deref_mut(), terminal))?;
        }
        if fds[3].revents != 0 {
            running = None;
        }
        if fds[4].revents != 0 {
            write_stdin(stdin.as_deref_mut(), host)?;
        }
    }
    Ok(())
}

/// Takes the host's messages for the command `pid`: sends it the signals,
/// queues its live standard input in `stdin`, sizes its `terminal`;
/// returns the channel to poll for more (-1 once it has closed).
fn take_messages(
    pid: u32,
    host: &mut impl Host,
    channel: RawFd,
    (mut stdin, terminal): (Option<&mut StdinPipe>, Option<&Terminal>),
) -> io::Result<RawFd> {
    let Ok(messages) = host.messages() else {
        return Ok(-1);
    };
    for message in messages {
        match (message, stdin.as_deref_mut()) {
            (HostMessage::Signal(signal), _) => {
                // SAFETY: kill(2) takes two integers and touches no memory of
                // ours; a command that has already exited is no error here.
                unsafe { libc::kill(pid as libc::pid_t, libc::c_int::from(signal)) };
            }
            (HostMessage::Resize(size), _) => {
                if let Some(terminal) = terminal {
                    terminal.resize(size)?;
                }
            }
            (HostMessage::Stdin(chunk), Some(pipe)) => pipe.push(chunk),
            (HostMessage::StdinEnd, Some(pipe)) => pipe.end(),
            // Another job's, or a host that sends live stdin unasked.
            _ => {}
        }
    }
    write_stdin(stdin, host)?;
    Ok(channel)
}

/// Writes what the command's stdin pipe takes now, and tells the host of
/// each chunk done with, for its flow control.
fn write_stdin(stdin: Option<&mut StdinPipe>, host: &mut impl Host) -> io::Result<()> {
    if let Some(pipe) = stdin {
        for _ in 0..pipe.write()? {
            host.send(GuestMessage::Received);
        }
    }
    Ok(())
}

/// A descriptor that polls readable once the process `pid` has exited.
fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new
    // descriptor (or -1), touching no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Reaps the orphans that ended since the last job (PID 1 inherits every
/// orphan in the guest), so that no zombie of theirs shows to the command.
fn reap_orphans() {
    // SAFETY: waitpid(2) with a null status pointer writes no status;
    // it touches no memory of ours.
    while unsafe { libc::waitpid(-1, ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// Waits for the process `pid`, reaping (and ignoring) the orphans that end
/// before it.
fn reap(pid: u32) -> io::Result<Outcome> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a local c_int that waitpid(2) may write; it
        // outlives the call.
        let reaped = unsafe { libc::waitpid(-1, &mut status, 0) };
        if reaped < 0 {
            return Err(io::Error::last_os_error());
        }
        if reaped as u32 == pid {
            return Ok(outcome(status));
        }
    }
}

/// The outcome of a wait status (of an ended process: no stops are asked for).
fn outcome(status: libc::c_int) -> Outcome {
    if libc::WIFSIGNALED(status) {
        Outcome::Signaled(libc::WTERMSIG(status))
    } else {
        Outcome::Exited(libc::WEXITSTATUS(status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_guest_agent::{ProvRecord, WindowSize};
    use std::io::Write;

    #[test]
    fn wait_statuses_map_to_outcomes() {
        assert_eq!(outcome(0), Outcome::Exited(0));
        assert_eq!(outcome(3 << 8), Outcome::Exited(3));
        assert_eq!(outcome(255 << 8), Outcome::Exited(255));
        assert_eq!(outcome(libc::SIGKILL), Outcome::Signaled(9));
        // A core dump sets 0x80 on top of the signal.
        assert_eq!(outcome(libc::SIGSEGV | 0x80), Outcome::Signaled(11));
    }

    #[test]
    fn spawn_errors_map_to_shell_outcomes() {
        let failure = |errno| spawn_failure(&io::Error::from_raw_os_error(errno));
        assert_eq!(failure(libc::ENOENT), Some(Outcome::NotFound));
        assert_eq!(failure(libc::ENOTDIR), Some(Outcome::NotFound));
        assert_eq!(failure(libc::EACCES), Some(Outcome::NotExecutable));
        assert_eq!(failure(libc::ENOEXEC), Some(Outcome::NotExecutable));
        assert_eq!(failure(libc::EISDIR), Some(Outcome::NotExecutable));
        assert_eq!(failure(libc::EAGAIN), None);
        assert_eq!(failure(libc::ENOMEM), None);
        let invalid = io::Error::new(io::ErrorKind::InvalidInput, "nul byte");
        assert_eq!(spawn_failure(&invalid), None);
    }

    #[test]
    fn env_entries_split_at_the_first_equals() {
        fn pair<'a>(key: &'a str, value: &'a str) -> Option<(&'a OsStr, &'a OsStr)> {
            Some((OsStr::new(key), OsStr::new(value)))
        }
        assert_eq!(
            env_entry(b"PATH=/bin:/usr/bin"),
            pair("PATH", "/bin:/usr/bin")
        );
        assert_eq!(env_entry(b"A=b=c"), pair("A", "b=c"));
        assert_eq!(env_entry(b"EMPTY="), pair("EMPTY", ""));
        assert_eq!(env_entry(b"NOVALUE"), None);
    }

    #[test]
    fn working_dirs_start_at_the_root() {
        assert_eq!(working_dir(b"/tmp"), Path::new("/tmp"));
        assert_eq!(working_dir(b"tmp"), Path::new("/tmp"));
        assert_eq!(working_dir(b""), Path::new("/"));
    }

    fn run_on_host(
        argv: &[&str],
        env: &[&str],
        cwd: &str,
    ) -> (Result<Outcome, String>, Vec<GuestMessage>) {
        run_job_on_host(&host_job(argv, env, cwd))
    }

    fn host_job(argv: &[&str], env: &[&str], cwd: &str) -> Job {
        let bytes = |items: &[&str]| items.iter().map(|item| item.as_bytes().to_vec()).collect();
        Job {
            argv: bytes(argv),
            env: bytes(env),
            cwd: cwd.as_bytes().to_vec(),
            ..Job::default()
        }
    }

    /// The host of a test: it keeps the messages, and asks for `signal`
    /// once the command has written `when` to its output, on a pipe that
    /// stands for the channel.
    struct TestHost {
        messages: Vec<GuestMessage>,
        signal: Option<(&'static [u8], u8)>,
        channel: (io::PipeReader, io::PipeWriter),
        asked: usize,
        /// Live stdin messages, all there from the start.
        stdin: Vec<HostMessage>,
    }

    impl Host for TestHost {
        fn send(&mut self, message: GuestMessage) {
            if let (GuestMessage::Stdout(bytes), Some((when, signal))) = (&message, self.signal) {
                if bytes.windows(when.len()).any(|window| window == when) {
                    self.channel.1.write_all(&[signal]).unwrap();
                    self.asked += 1;
                }
            }
            self.messages.push(message);
        }

        fn channel(&self) -> RawFd {
            self.channel.0.as_raw_fd()
        }

        fn messages(&mut self) -> io::Result<Vec<HostMessage>> {
            let mut signals = vec![0; std::mem::take(&mut self.asked)];
            self.channel.0.read_exact(&mut signals)?;
            let signals = signals.into_iter().map(HostMessage::Signal);
            Ok(std::mem::take(&mut self.stdin)
                .into_iter()
                .chain(signals)
                .collect())
        }
    }

    /// What the command wrote to its standard output, over `messages`.
    fn stdout_of(messages: &[GuestMessage]) -> Vec<u8> {
        messages
            .iter()
            .filter_map(|message| match message {
                GuestMessage::Stdout(bytes) => Some(bytes.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn run_job_on_host(job: &Job) -> (Result<Outcome, String>, Vec<GuestMessage>) {
        signalled_on_host(job, None)
    }

    fn signalled_on_host(
        job: &Job,
        signal: Option<(&'static [u8], u8)>,
    ) -> (Result<Outcome, String>, Vec<GuestMessage>) {
        let null = File::open("/dev/null").unwrap();
        let mut host = TestHost {
            messages: Vec::new(),
            signal,
            channel: io::pipe().unwrap(),
            asked: 0,
            stdin: Vec::new(),
        };
        let result = run(job, &null, None, &mut host);
        (result, host.messages)
    }

    /// `job` with live stdin: the host's `stdin` messages, there before
    /// the command starts.
    fn fed_on_host(
        job: &Job,
        stdin: Vec<HostMessage>,
    ) -> (Result<Outcome, String>, Vec<GuestMessage>) {
        let (pipe, read) = StdinPipe::new().unwrap();
        let mut host = TestHost {
            messages: Vec::new(),
            signal: None,
            channel: io::pipe().unwrap(),
            asked: 0,
            stdin,
        };
        let result = run(job, &read, Some(pipe), &mut host);
        (result, host.messages)
    }

    /// One test runs every command: reap() waits for any child of the
    /// process, so commands of tests in parallel threads would mix.
    #[test]
    fn commands_run_on_the_host() {
        let script = "echo hi; echo err >&2; pwd; echo \"$FOO\"; exit 3";
        let (result, messages) = run_on_host(
            &["sh", "-c", script],
            &["PATH=/bin:/usr/bin", "FOO=bar"],
            "tmp",
        );
        assert_eq!(result, Ok(Outcome::Exited(3)));
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        for message in messages {
            match message {
                GuestMessage::Stdout(bytes) => stdout.extend(bytes),
                GuestMessage::Stderr(bytes) => stderr.extend(bytes),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(stdout, b"hi\n/tmp\nbar\n");
        assert_eq!(stderr, b"err\n");

        let (result, _) = run_on_host(&["sh", "-c", "kill -9 $$"], &["PATH=/bin:/usr/bin"], "/");
        assert_eq!(result, Ok(Outcome::Signaled(9)));

        // The job's PATH, not the agent's, finds the program.
        let (result, _) = run_on_host(&["sh", "-c", "true"], &["PATH=/nonexistent"], "/");
        assert_eq!(result, Ok(Outcome::NotFound));
        let (result, _) = run_on_host(&["/etc/passwd"], &[], "/");
        assert_eq!(result, Ok(Outcome::NotExecutable));

        let (result, _) = run_on_host(&["/bin/true"], &[], "/nonexistent");
        let reason = result.unwrap_err();
        assert!(reason.contains("/nonexistent"), "{reason}");
        assert!(run_on_host(&[], &[], "/").0.is_err());
        assert!(run_on_host(&["/bin/true"], &["NOVALUE"], "/").0.is_err());

        // Found in the job's PATH before the spawn: the program still sees
        // the name it was given, and a script with no #! line still runs
        // with /bin/sh, as execvp(3) runs it.
        let (_, messages) = run_on_host(&["sh", "-c", "echo $0"], &["PATH=/bin:/usr/bin"], "/");
        assert_eq!(messages, [GuestMessage::Stdout(b"sh\n".to_vec())]);
        let dir = scratch_dir("script");
        let script = dir.join("no-hash-bang");
        std::fs::write(&script, "echo run by sh\n").unwrap();
        std::fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("PATH={}:/bin:/usr/bin", dir.display());
        let (result, messages) = run_on_host(&["no-hash-bang"], &[&path], "/");
        assert_eq!(result, Ok(Outcome::Exited(0)));
        assert_eq!(messages, [GuestMessage::Stdout(b"run by sh\n".to_vec())]);

        // The signals the host asks for reach the command as it runs.
        // (Without the signal it gives up after 10 s, with status 3.)
        let trapping = "trap 'echo got TERM; exit 7' TERM; echo ready; \
                        for i in $(seq 100); do sleep 0.1; done; exit 3";
        let job = host_job(&["sh", "-c", trapping], &["PATH=/bin:/usr/bin"], "/");
        let (result, messages) = signalled_on_host(&job, Some((b"ready", libc::SIGTERM as u8)));
        assert_eq!(result, Ok(Outcome::Exited(7)));
        assert_eq!(stdout_of(&messages), b"ready\ngot TERM\n");

        // Live stdin reaches the command's pipe, each chunk acknowledged,
        // and its end closes the pipe.
        let job = host_job(
            &["sh", "-c", "cat; echo done"],
            &["PATH=/bin:/usr/bin"],
            "/",
        );
        let stdin = vec![
            HostMessage::Stdin(b"one\n".to_vec()),
            HostMessage::Stdin(b"two\n".to_vec()),
            HostMessage::StdinEnd,
        ];
        let (result, messages) = fed_on_host(&job, stdin);
        assert_eq!(result, Ok(Outcome::Exited(0)));
        let received = messages.iter().filter(|m| **m == GuestMessage::Received);
        assert_eq!(received.count(), 2);
        assert_eq!(stdout_of(&messages), b"one\ntwo\ndone\n");

        // On a terminal: the command's streams are it, of the job's size,
        // and what the host types is echoed and read as a line; its output
        // (stderr too) comes back as stdout, lines ended CR LF.
        let script = "test -t 0 && test -t 2 && echo on a terminal >&2; stty size; \
                      read line; echo \"got $line\"";
        let job = Job {
            terminal: Some(WindowSize {
                rows: 24,
                columns: 80,
            }),
            live_stdin: true,
            ..host_job(&["sh", "-c", script], &["PATH=/bin:/usr/bin"], "/")
        };
        let (result, messages) = fed_on_host(&job, vec![HostMessage::Stdin(b"typed\n".to_vec())]);
        assert_eq!(result, Ok(Outcome::Exited(0)));
        let stdout = String::from_utf8(stdout_of(&messages)).unwrap();
        // The echo falls where the line was typed (here, as the host's
        // thread ran); it comes before the line is read.
        let echo = stdout.find("typed\r\n").unwrap();
        assert!(echo < stdout.find("got typed").unwrap(), "{stdout}");
        let rest = stdout.replacen("typed\r\n", "", 1);
        assert_eq!(rest, "on a terminal\r\n24 80\r\ngot typed\r\n");
        // A new size from the host, before the line it waits for.
        let job = Job {
            argv: ["sh", "-c", "read line; stty size"]
                .map(|arg| arg.as_bytes().to_vec())
                .to_vec(),
            ..job
        };
        let resized = WindowSize {
            rows: 30,
            columns: 100,
        };
        let stdin = vec![
            HostMessage::Resize(resized),
            HostMessage::Stdin(b"typed\n".to_vec()),
        ];
        let (result, messages) = fed_on_host(&job, stdin);
        assert_eq!(result, Ok(Outcome::Exited(0)));
        assert_eq!(stdout_of(&messages), b"typed\r\n30 100\r\n");

        traced_pipeline_on_host();
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("provm-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_bare_name_is_found_in_the_path_as_execvp_finds_it() {
        let dir = scratch_dir("path");
        let (plain, tool) = (dir.join("plain"), dir.join("tool"));
        std::fs::write(&plain, "").unwrap();
        std::fs::write(&tool, "").unwrap();
        std::fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(dir.join("sub/tool")).unwrap();
        let find =
            |program: &str, path: &str| find_in_path(OsStr::new(program), Some(OsStr::new(path)));
        let search = |first: &str| format!("{}:{}", dir.join(first).display(), dir.display());
        // Directories and files without an execute bit are passed over.
        assert_eq!(find("tool", &search("sub")), Some(tool.clone()));
        assert_eq!(find("plain", &dir.display().to_string()), None);
        assert_eq!(find("missing", &dir.display().to_string()), None);
        // Names with a slash, and no PATH, are left to the spawn.
        assert_eq!(find("./tool", &dir.display().to_string()), None);
        assert_eq!(find_in_path(OsStr::new("tool"), None), None);
    }

    /// The tracer on the host's own shell and sort: the records name the
    /// programs and credit each file to the process that wrote it.
    fn traced_pipeline_on_host() {
        let dir = scratch_dir("trace");
        std::fs::write(dir.join("in.txt"), "pear\napple\n").unwrap();
        let script = "sort in.txt > mid.txt; wc -l mid.txt > out.txt";
        let job = Job {
            provenance: true,
            ..host_job(
                &["sh", "-c", script],
                &["PATH=/bin:/usr/bin"],
                dir.to_str().unwrap(),
            )
        };
        let (result, messages) = run_job_on_host(&job);
        assert_eq!(result, Ok(Outcome::Exited(0)));
        assert_eq!(
            std::fs::read_to_string(dir.join("out.txt")).unwrap(),
            "2 mid.txt\n"
        );
        let records: Vec<ProvRecord> = messages
            .into_iter()
            .flat_map(|message| match message {
                GuestMessage::Provenance(records) => records,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        let path_of = |id: u32| {
            records.iter().find_map(|record| match record {
                ProvRecord::File(file) if file.id == id => Some(file.path.clone()),
                _ => None,
            })
        };
        let program_of = |id: u32| {
            records.iter().find_map(|record| match record {
                ProvRecord::Process(process) if process.id == id => Some(process.argv[0].clone()),
                _ => None,
            })
        };
        let in_dir = |name: &str| Some(dir.join(name).to_str().unwrap().as_bytes().to_vec());
        let pairs = |relation: fn(&ProvRecord) -> Option<(u32, u32)>| -> Vec<_> {
            let pairs = records.iter().filter_map(relation);
            pairs
                .map(|(file, process)| (path_of(file), program_of(process)))
                .collect()
        };
        let generated = pairs(|record| match record {
            ProvRecord::Generated { file, process, .. } => Some((*file, *process)),
            _ => None,
        });
        assert!(
            generated.contains(&(in_dir("mid.txt"), Some(b"sort".to_vec()))),
            "{generated:?}"
        );
        assert!(
            generated.contains(&(in_dir("out.txt"), Some(b"wc".to_vec()))),
            "{generated:?}"
        );
        assert_eq!(generated.len(), 2, "{generated:?}");
        let used = pairs(|record| match record {
            ProvRecord::Used { file, process, .. } => Some((*file, *process)),
            _ => None,
        });
        assert!(
            used.contains(&(in_dir("in.txt"), Some(b"sort".to_vec()))),
            "{used:?}"
        );
        assert!(
            used.contains(&(in_dir("mid.txt"), Some(b"wc".to_vec()))),
            "{used:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
