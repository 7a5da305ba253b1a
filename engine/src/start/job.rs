//! The job the guest's agent runs for a run's options: the command, its
//! environment, who runs it, and its entropy.

use std::os::unix::ffi::OsStringExt;

use provm_guest_agent::Job;

use super::{RunError, RunOptions};

/// The environment every command starts from; `--env` adds and overrides.
const DEFAULT_ENV: &[&str] = &[
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
];

/// The job the agent runs for these options.
pub fn job(options: &RunOptions, root_device: &str) -> Result<Job, RunError> {
    let mut env: Vec<String> = DEFAULT_ENV.iter().map(|entry| entry.to_string()).collect();
    for entry in &options.env {
        let Some((key, _)) = entry.split_once('=').filter(|(key, _)| !key.is_empty()) else {
            return Err(RunError::BadEnv(entry.clone()));
        };
        env.retain(|existing| !existing.starts_with(&format!("{key}=")));
        env.push(entry.clone());
    }
    Ok(Job {
        argv: options
            .command
            .iter()
            .map(|arg| arg.clone().into_vec())
            .collect(),
        env: env.into_iter().map(String::into_bytes).collect(),
        cwd: options.cwd.clone().into_bytes(),
        user: options.user.clone().unwrap_or_default().into_bytes(),
        hostname: options.hostname.clone().unwrap_or_default().into_bytes(),
        rlimits: options.rlimits.clone(),
        terminal: options.terminal,
        leave_root_clean: options.keep_overlay.is_some() && !options.overlay_reader_replays_journal,
        root_device: root_device.as_bytes().to_vec(),
        entropy: match &options.pinned {
            Some(pinning) => pinning.entropy(),
            None => fresh_entropy()?,
        },
        // Stamped when the job is sent (GuestSession::run).
        wall_clock_ns: 0,
        // Asked for by an observer that captures it (`Observer::job_starting`).
        provenance: false,
        // Filled in from the job's data (`JobData::describe`).
        ..Job::default()
    })
}

/// 32 bytes from the host's random generator.
fn fresh_entropy() -> Result<Vec<u8>, RunError> {
    let mut seed = vec![0; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(RunError::Entropy)?,
        &mut seed,
    )
    .map_err(RunError::Entropy)?;
    Ok(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(env: &[&str]) -> RunOptions {
        RunOptions {
            env: env.iter().map(|e| e.to_string()).collect(),
            cwd: "/tmp".into(),
            ..RunOptions::new("img".into(), vec!["sh".into(), "-c".into(), "true".into()])
        }
    }

    #[test]
    fn env_overrides_defaults_and_adds() {
        let job = job(&options(&["PATH=/bin", "FOO=a=b"]), "/dev/vda1").unwrap();
        let env: Vec<String> = job
            .env
            .into_iter()
            .map(|e| String::from_utf8(e).unwrap())
            .collect();
        assert!(env.contains(&"PATH=/bin".to_owned()));
        assert!(env.contains(&"FOO=a=b".to_owned()));
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
        assert!(env.contains(&"HOME=/root".to_owned()));
        assert_eq!(job.root_device, b"/dev/vda1");
        assert_eq!(job.cwd, b"/tmp");
    }

    #[test]
    fn malformed_env_is_refused() {
        assert!(matches!(
            job(&options(&["NOEQUALS"]), "/dev/vda"),
            Err(RunError::BadEnv(_))
        ));
        assert!(matches!(
            job(&options(&["=x"]), "/dev/vda"),
            Err(RunError::BadEnv(_))
        ));
    }
}
