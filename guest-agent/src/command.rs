//! Runs a job's command: spawns it, forwards its output, reports its outcome.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::{env, ptr};

use provm_guest_agent::{provenance_messages, GuestMessage, Job, Outcome};

use crate::provenance;

/// Most bytes read from a pipe at once, each read sent as one frame: the
/// channel's writes are system calls, slow in the emulated guest kernel, so
/// fewer and larger is better. (A pipe holds 64 KiB by default.)
const CHUNK: usize = 64 * 1024;

/// Runs `job` in the current root with `stdin` as its standard input, passing
/// each piece of its output to `emit` as it arrives, then its provenance if
/// the job asked for it. `Err` is a reason the command could not be run,
/// for a `Failed` message.
pub fn run(job: &Job, stdin: &File, mut emit: impl FnMut(GuestMessage)) -> Result<Outcome, String> {
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
    let stdin = stdin
        .try_clone()
        .map_err(|error| format!("cannot duplicate the standard input: {error}"))?;
    let mut command = command(program, args, &job.env)?;
    command.stdin(stdin);
    let not_started = |error: io::Error| {
        let program = String::from_utf8_lossy(program);
        spawn_failure(&error).ok_or_else(|| format!("cannot run {program}: {error}"))
    };
    let output_error = |error| format!("cannot read the command's output: {error}");
    if job.provenance {
        let mut traced = match provenance::spawn(command) {
            Ok(traced) => traced,
            Err(error) => return not_started(error),
        };
        forward(traced.stdout.take(), traced.stderr.take(), &mut emit).map_err(output_error)?;
        let (outcome, records) = traced
            .finish()
            .map_err(|error| format!("cannot trace the command: {error}"))?;
        provenance_messages(records).into_iter().for_each(emit);
        return Ok(outcome);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return not_started(error),
    };
    forward(child.stdout.take(), child.stderr.take(), emit).map_err(output_error)?;
    reap(child.id()).map_err(|error| format!("cannot wait for the command: {error}"))
}

/// The job's working directory; a relative one starts at the root (not at
/// the previous job's directory).
fn working_dir(cwd: &[u8]) -> PathBuf {
    Path::new("/").join(OsStr::from_bytes(cwd))
}

/// The command, with exactly the environment `env` (whose PATH is the one
/// `program` is looked up in) and its outputs piped to the agent.
fn command(program: &[u8], args: &[Vec<u8>], env: &[Vec<u8>]) -> Result<Command, String> {
    let mut command = Command::new(OsStr::from_bytes(program));
    command
        .args(args.iter().map(|arg| OsStr::from_bytes(arg)))
        .env_clear()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for entry in env {
        let (key, value) = env_entry(entry).ok_or_else(|| {
            let entry = String::from_utf8_lossy(entry);
            format!("environment entry {entry:?} has no '='")
        })?;
        command.env(key, value);
    }
    Ok(command)
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

/// Passes the command's output to `emit` as it arrives, each stream in its
/// own message, until both pipes are at end of file.
fn forward(
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    mut emit: impl FnMut(GuestMessage),
) -> io::Result<()> {
    let mut outputs: [Output; 2] = [
        (
            stdout.map(OwnedFd::from).map(File::from),
            GuestMessage::Stdout,
        ),
        (
            stderr.map(OwnedFd::from).map(File::from),
            GuestMessage::Stderr,
        ),
    ];
    let mut buffer = vec![0; CHUNK];
    while outputs.iter().any(|(pipe, _)| pipe.is_some()) {
        let mut fds = outputs.each_ref().map(|(pipe, _)| libc::pollfd {
            // poll() skips negative descriptors.
            fd: pipe.as_ref().map_or(-1, AsRawFd::as_raw_fd),
            events: libc::POLLIN,
            revents: 0,
        });
        // No EINTR to retry: the agent has no signal handlers.
        // SAFETY: `fds` is a live, exclusively borrowed array of
        // `fds.len()` pollfd entries, which poll(2) reads and writes in place.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) } < 0 {
            return Err(io::Error::last_os_error());
        }
        for ((pipe, message), fd) in outputs.iter_mut().zip(fds) {
            if fd.revents == 0 {
                continue;
            }
            if let Some(file) = pipe {
                match file.read(&mut buffer)? {
                    0 => *pipe = None,
                    len => emit(message(buffer[..len].to_vec())),
                }
            }
        }
    }
    Ok(())
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
    use provm_guest_agent::ProvRecord;

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

    fn run_job_on_host(job: &Job) -> (Result<Outcome, String>, Vec<GuestMessage>) {
        let null = File::open("/dev/null").unwrap();
        let mut messages = Vec::new();
        let result = run(job, &null, |message| messages.push(message));
        (result, messages)
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

        traced_pipeline_on_host();
    }

    /// The tracer on the host's own shell and sort: the records name the
    /// programs and credit each file to the process that wrote it.
    fn traced_pipeline_on_host() {
        let dir = std::env::temp_dir().join(format!("provm-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
