//! Runs a job's command: spawns it, forwards its output, reports its outcome.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::{env, fs, ptr};

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
    let env = environment(&job.env)?;
    let ids = crate::user::ids(&job.user)?;
    let not_started = |error: io::Error| {
        let program = String::from_utf8_lossy(program);
        spawn_failure(&error).ok_or_else(|| format!("cannot run {program}: {error}"))
    };
    let output_error = |error| format!("cannot read the command's output: {error}");
    let program = OsStr::from_bytes(program);
    let command_of = |program: &OsStr| -> Result<Command, String> {
        let stdin = stdin
            .try_clone()
            .map_err(|error| format!("cannot duplicate the standard input: {error}"))?;
        let mut command = command(program, args, &env, stdin);
        if let Some((uid, gid)) = ids {
            command.uid(uid).gid(gid);
        }
        Ok(command)
    };
    if job.provenance {
        let mut traced = match provenance::spawn(command_of(program)?) {
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
    let mut child = match spawn(program, search_path(&env), command_of)? {
        Ok(child) => child,
        Err(error) => return not_started(error),
    };
    forward(child.stdout.take(), child.stderr.take(), emit).map_err(output_error)?;
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
/// a bare `program` is looked up in), `stdin` as its standard input and
/// its outputs piped to the agent.
fn command(program: &OsStr, args: &[Vec<u8>], env: &[(&OsStr, &OsStr)], stdin: File) -> Command {
    let mut command = Command::new(program);
    command
        .args(args.iter().map(|arg| OsStr::from_bytes(arg)))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
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
