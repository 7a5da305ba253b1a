//! The few ptrace and process-inspection calls the tracer makes, each a
//! safe function over one system call.
//!
//! Over libc rather than `nix::sys::ptrace` (0.30): nix passes signals as
//! its `Signal` enum, which has no real-time signals, so a tracee stopped by
//! one (glibc uses SIGRTMIN and SIGRTMIN+1 itself, for thread cancellation
//! and set*id calls) could neither be reported by nix's `waitpid` (EINVAL)
//! nor have its signal delivered by `cont`. Size was no obstacle (+15 KB
//! with seccompiler, see seccomp.rs).

use std::ffi::CStr;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;

pub type Pid = libc::pid_t;

/// What the tracer asks of every tracee: stop at seccomp TRACE verdicts,
/// follow every new process and thread, report exec, mark syscall-exit
/// stops, and kill the tracees if the agent ever goes away (a tracee left
/// with the filter but no tracer would fail every traced call).
const OPTIONS: libc::c_int = libc::PTRACE_O_TRACESECCOMP
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACESYSGOOD
    | libc::PTRACE_O_EXITKILL;

fn check(result: libc::c_long) -> io::Result<libc::c_long> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Called in the child between fork and exec: its parent (the tracer
/// thread) traces it from the exec on.
pub fn trace_me() -> io::Result<()> {
    // SAFETY: PTRACE_TRACEME takes no pointers and changes only who
    // traces this process.
    check(unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) }).map(drop)
}

pub fn set_options(pid: Pid) -> io::Result<()> {
    // SAFETY: PTRACE_SETOPTIONS takes its options by value, no
    // pointer; the kernel checks that `pid` is our stopped tracee.
    check(unsafe { libc::ptrace(libc::PTRACE_SETOPTIONS, pid, 0, OPTIONS) }).map(drop)
}

/// Resumes a stopped tracee, delivering `signal` (0 for none).
pub fn resume(pid: Pid, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: PTRACE_CONT takes the signal by value, no pointer.
    check(unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, signal) }).map(drop)
}

/// Resumes a tracee stopped at a system call's entry until the call returns.
pub fn resume_to_syscall_exit(pid: Pid) -> io::Result<()> {
    // SAFETY: PTRACE_SYSCALL takes no pointers.
    check(unsafe { libc::ptrace(libc::PTRACE_SYSCALL, pid, 0, 0) }).map(drop)
}

pub fn registers(pid: Pid) -> io::Result<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain integers: all-zero is valid.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct, which
    // `regs` is, and it outlives the call.
    check(unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, 0, &mut regs) })?;
    Ok(regs)
}

/// The value a ptrace event stop carries (the new process of a fork).
pub fn event_message(pid: Pid) -> io::Result<u64> {
    let mut message: libc::c_ulong = 0;
    // SAFETY: PTRACE_GETEVENTMSG writes one unsigned long, which
    // `message` is, and it outlives the call.
    check(unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, pid, 0, &mut message) })?;
    Ok(message)
}

/// Whether a stop with a stop signal is a group stop (job control) rather
/// than the signal's delivery: only delivery stops have signal information.
pub fn is_group_stop(pid: Pid) -> bool {
    // SAFETY: siginfo_t is plain data (integers and a union of them):
    // all-zero is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETSIGINFO writes one siginfo_t, which `info`
    // is, and it outlives the call.
    unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, pid, 0, &mut info) < 0 }
}

/// Reads `buffer.len()` bytes (fewer where the tracee's mapping ends) at
/// `address` in the tracee; returns how many were read.
pub fn read_memory(pid: Pid, address: u64, buffer: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    // SAFETY: `local` describes `buffer`, exclusively borrowed and
    // alive for the call, of exactly its length; `remote` names memory of the
    // tracee, which the kernel checks (a bad address is an error, not ours to
    // fault on).
    let read = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    check(read as libc::c_long).map(|read| read as usize)
}

/// The NUL-terminated string at `address` in the tracee (a path: at most
/// PATH_MAX bytes).
pub fn read_string(pid: Pid, address: u64) -> io::Result<Vec<u8>> {
    // Most paths are short: copying a whole PATH_MAX from the tracee costs
    // guest kernel time for every traced call.
    for size in [256, libc::PATH_MAX as usize] {
        let mut buffer = vec![0; size];
        let len = read_memory(pid, address, &mut buffer)?;
        if let Ok(string) = CStr::from_bytes_until_nul(&buffer[..len]) {
            return Ok(string.to_bytes().to_vec());
        }
        if len < size {
            break;
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG))
}

pub fn read_u64(pid: Pid, address: u64) -> io::Result<u64> {
    let mut bytes = [0; 8];
    match read_memory(pid, address, &mut bytes)? {
        8 => Ok(u64::from_le_bytes(bytes)),
        _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

/// The next change of any tracee (or child), waiting for it: its pid and
/// wait status; `None` when there is no child left.
pub fn wait_any() -> io::Result<Option<(Pid, libc::c_int)>> {
    let mut status = 0;
    // SAFETY: `status` is a local c_int that waitpid(2) may write;
    // it outlives the call.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
    if pid < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ECHILD) => Ok(None),
            _ => Err(error),
        };
    }
    Ok(Some((pid, status)))
}

/// A symbolic link under /proc/PID (`exe`, `cwd`, `fd/N`).
pub fn proc_link(pid: Pid, name: &str) -> io::Result<Vec<u8>> {
    let target = std::fs::read_link(format!("/proc/{pid}/{name}"))?;
    Ok(target.as_os_str().as_bytes().to_vec())
}

/// A task's name (/proc/PID/comm), in one read: three system calls where
/// `std::fs::read` makes five.
pub fn comm(pid: Pid) -> io::Result<Vec<u8>> {
    // The kernel keeps 15 bytes of a name, and ends it with a newline.
    let mut buffer = [0; 64];
    let len = std::fs::File::open(format!("/proc/{pid}/comm"))?.read(&mut buffer)?;
    let comm = &buffer[..len];
    Ok(comm.strip_suffix(b"\n").unwrap_or(comm).to_vec())
}

/// A NUL-separated list under /proc/PID (`cmdline`, `environ`).
pub fn proc_list(pid: Pid, name: &str) -> io::Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(format!("/proc/{pid}/{name}"))?;
    Ok(nul_separated(&bytes))
}

/// The items of a NUL-terminated list; empty items (an empty argument) stay.
fn nul_separated(bytes: &[u8]) -> Vec<Vec<u8>> {
    let Some(body) = bytes.strip_suffix(&[0]) else {
        return if bytes.is_empty() {
            Vec::new()
        } else {
            vec![bytes.to_vec()]
        };
    };
    body.split(|&byte| byte == 0).map(<[u8]>::to_vec).collect()
}

/// The file descriptors a process has open, as the paths they name.
pub fn open_files(pid: Pid) -> io::Result<Vec<Vec<u8>>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // A descriptor closed while listing is simply not there.
        if let Ok(target) = std::fs::read_link(entry?.path()) {
            paths.push(target.as_os_str().as_bytes().to_vec());
        }
    }
    Ok(paths)
}

/// The files a process can still write: those it has open, and, if it
/// `may_map` (see `Recorder::may_map_writable`), those it maps shared and
/// writable (a mapping outlives its descriptor's close).
pub fn writable_files(pid: Pid, may_map: bool) -> io::Result<Vec<Vec<u8>>> {
    let mut paths = open_files(pid)?;
    if may_map {
        let maps = std::fs::read(format!("/proc/{pid}/maps"))?;
        paths.extend(shared_writable_mappings(&maps));
    }
    Ok(paths)
}

/// The paths of /proc/PID/maps lines whose permissions are `?w?s`.
fn shared_writable_mappings(maps: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    maps.split(|&byte| byte == b'\n').filter_map(|line| {
        // address perms offset dev inode path (the path may hold spaces).
        let mut fields = line.splitn(6, |&byte| byte == b' ');
        let perms = fields.nth(1)?;
        let path = fields.nth(3)?.trim_ascii_start();
        (perms.get(1) == Some(&b'w') && perms.get(3) == Some(&b's') && path.starts_with(b"/"))
            .then(|| path.to_vec())
    })
}

/// The guest's wall clock, in nanoseconds since the epoch.
pub fn now_ns() -> u64 {
    // SAFETY: timespec is two integers: all-zero is valid.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `now` is a local timespec that clock_gettime(2)
    // writes; it outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_separated_lists_keep_empty_items() {
        assert_eq!(nul_separated(b"sh\0-c\0\0"), [&b"sh"[..], b"-c", b""]);
        assert_eq!(nul_separated(b""), Vec::<Vec<u8>>::new());
        assert_eq!(nul_separated(b"unterminated"), [b"unterminated"]);
    }

    #[test]
    fn shared_writable_mappings_are_found() {
        let maps = b"00400000-00401000 r-xp 00000000 fe:00 12 /bin/busybox\n\
7f00-7f01 rw-s 00000000 fe:00 13                         /data/a b\n\
7f01-7f02 r--s 00000000 fe:00 14                         /data/ro\n\
7f02-7f03 rw-s 00000000 00:01 15                         /dev/zero (deleted)\n\
7f03-7f04 rw-p 00000000 00:00 0 \n";
        let paths: Vec<Vec<u8>> = shared_writable_mappings(maps).collect();
        assert_eq!(paths, [&b"/data/a b"[..], b"/dev/zero (deleted)"]);
    }

    #[test]
    fn names_are_read_without_their_newline() {
        let name = std::fs::read(format!("/proc/{}/comm", std::process::id())).unwrap();
        assert_eq!(
            comm(std::process::id() as Pid).unwrap(),
            name.trim_ascii_end()
        );
    }

    #[test]
    fn strings_are_read_from_a_process() {
        let text = c"/data/in.txt";
        let pid = std::process::id() as Pid;
        let address = text.as_ptr() as u64;
        assert_eq!(read_string(pid, address).unwrap(), b"/data/in.txt");
        let long = std::ffi::CString::new(vec![b'a'; 1000]).unwrap();
        let read = read_string(pid, long.as_ptr() as u64).unwrap();
        assert_eq!(read, long.as_bytes());
    }
}
