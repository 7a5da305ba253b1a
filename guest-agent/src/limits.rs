//! A job's host name and resource limits (a container's `hostname` and
//! `rlimits`), set for its command. The agent is PID 1 of a guest of its
//! own, so the host name is the whole guest's, as a container's UTS
//! namespace is. The limits are set on the agent around the spawn, which
//! the command inherits, rather than in the child after its fork: the
//! command is started by posix_spawn, which runs no code of ours in the
//! child (see `command::find_in_path`).

use std::io;

use provm_guest_agent::Rlimit;

/// Sets the guest's host name to `name`; nothing if it is empty.
pub fn set_hostname(name: &[u8]) -> Result<(), String> {
    if name.is_empty() {
        return Ok(());
    }
    // SAFETY: the kernel reads `name.len()` bytes from a live slice.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
        let error = io::Error::last_os_error();
        return Err(format!(
            "cannot set the host name {:?}: {error}",
            String::from_utf8_lossy(name)
        ));
    }
    Ok(())
}

/// The agent's own limits while `limits` are set; put back when dropped,
/// once the command has inherited them.
pub struct Limited {
    saved: Vec<(u32, libc::rlimit)>,
}

/// Sets `limits` on the agent, until the returned guard is dropped.
pub fn set(limits: &[Rlimit]) -> Result<Limited, String> {
    let mut limited = Limited { saved: Vec::new() };
    for limit in limits {
        let old = get(limit.resource).map_err(|error| failed(limit, error))?;
        let new = libc::rlimit {
            rlim_cur: limit.soft,
            rlim_max: limit.hard,
        };
        put(limit.resource, &new).map_err(|error| failed(limit, error))?;
        limited.saved.push((limit.resource, old));
    }
    Ok(limited)
}

impl Drop for Limited {
    fn drop(&mut self) {
        // The agent runs as root: it may raise a hard limit again.
        for (resource, old) in self.saved.iter().rev() {
            put(*resource, old).ok();
        }
    }
}

fn failed(limit: &Rlimit, error: io::Error) -> String {
    format!(
        "cannot set resource limit {} to {}:{}: {error}",
        limit.resource, limit.soft, limit.hard
    )
}

fn get(resource: u32) -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: the kernel writes one rlimit into a live local.
    match unsafe { libc::getrlimit(resource as _, &mut limit) } {
        0 => Ok(limit),
        _ => Err(io::Error::last_os_error()),
    }
}

fn put(resource: u32, limit: &libc::rlimit) -> io::Result<()> {
    // SAFETY: the kernel reads one rlimit from a live reference.
    match unsafe { libc::setrlimit(resource as _, limit) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_set_for_the_spawn_and_put_back() {
        let before = get(libc::RLIMIT_NOFILE).unwrap();
        let lower = Rlimit {
            resource: libc::RLIMIT_NOFILE,
            soft: 64.min(before.rlim_cur),
            hard: before.rlim_max,
        };
        {
            let _limited = set(&[lower]).unwrap();
            assert_eq!(get(lower.resource).unwrap().rlim_cur, lower.soft);
        }
        assert_eq!(get(lower.resource).unwrap().rlim_cur, before.rlim_cur);
    }
}
