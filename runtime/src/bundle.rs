//! A bundle's config.json read into what the VM runs (`Plan`): the
//! command, its environment, the host folders it reads, its vCPUs and
//! memory. What a VM cannot honour is refused with the field it is in;
//! what the VM makes moot (namespaces, cgroups, seccomp, capabilities, the
//! usual /proc, /dev and /sys mounts) is ignored with a warning, as Kata
//! Containers does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Linux, Mount, PosixRlimit, PosixRlimitType, Process, Spec};
use serde::{Deserialize, Serialize};

/// The annotation that turns recording off for one container.
pub const RECORD_ANNOTATION: &str = "run.provm.record";
/// The runtime-spec major version this runtime reads.
const SPEC_MAJOR: &str = "1";
/// The guest memory below which the guest kernel and its agent do not fit.
const MIN_MEMORY_MIB: u64 = 64;
/// The most vCPUs a guest has (the engine's `--cpus` range).
const MAX_CPUS: u64 = 64;

/// Where a container runs what, as the container process needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The root directory (config.json's `root.path`, made absolute).
    pub rootfs: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    /// `UID:GID`; `None`: root.
    pub user: Option<String>,
    /// The guest's host name for the command; `None`: provm's.
    pub hostname: Option<String>,
    /// The command's resource limits, set in the guest (see `rlimit`).
    pub rlimits: Vec<PosixRlimit>,
    /// The command's standard streams are a terminal (`--console-socket`).
    pub terminal: bool,
    /// Read-only host files and folders: (host path, guest path).
    pub inputs: Vec<(PathBuf, String)>,
    /// Read-write host files and folders (host path, guest path): each
    /// goes in as an input and comes back at exit as an output, replacing
    /// the host's.
    pub volumes: Vec<(PathBuf, String)>,
    /// Where the engine binds its own files, which the VM makes moot:
    /// the root holds an empty placeholder there (see `placeholders`).
    pub mount_points: Vec<PathBuf>,
    /// From `linux.resources.cpu`; `None`: the engine's default.
    pub cpus: Option<u8>,
    /// From `linux.resources.memory.limit`; `None`: the engine's default.
    pub memory_mib: Option<u64>,
    pub annotations: BTreeMap<String, String>,
}

impl Plan {
    /// Every host file and folder the guest gets, read-only or not.
    pub fn host_folders(&self) -> impl Iterator<Item = &(PathBuf, String)> {
        self.inputs.iter().chain(&self.volumes)
    }

    /// Whether the container is recorded (unless `run.provm.record=false`).
    pub fn recorded(&self) -> bool {
        self.annotations.get(RECORD_ANNOTATION).map(String::as_str) != Some("false")
    }

    /// The empty files an engine makes in each container's root, relative
    /// to it: its mount points, Docker's marker /.dockerenv, and the
    /// console it makes under /dev (where the guest mounts its own
    /// devtmpfs). Made anew for every container, their times would make
    /// every root a disk of its own, booted anew (see `root_dir`).
    pub fn placeholders(&self) -> Vec<PathBuf> {
        self.mount_points
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/.dockerenv"), Path::new("/dev/console")])
            .filter_map(|path| path.strip_prefix("/").ok())
            .map(Path::to_path_buf)
            .collect()
    }
}

/// A bundle read: the plan, and what was ignored (one warning a field).
#[derive(Debug)]
pub struct Read {
    pub plan: Plan,
    pub warnings: Vec<String>,
}

/// Reads the bundle at `bundle`.
pub fn read(bundle: &Path) -> Result<Read, String> {
    if !bundle.is_dir() {
        return Err(format!(
            "the bundle {} does not exist or is not a directory: pass the folder that holds config.json with --bundle",
            bundle.display()
        ));
    }
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|error| {
        format!(
            "cannot read {}: {error}; a bundle holds config.json (`runc spec` writes one)",
            path.display()
        )
    })?;
    check_version(&path, &text)?;
    let spec: Spec = serde_json::from_str(&text).map_err(|error| {
        format!(
            "{} is not a valid runtime specification: {error}",
            path.display()
        )
    })?;
    plan(bundle, &spec)
}

/// Refuses a config.json of another major version before reading the rest,
/// whose fields that version may name otherwise.
fn check_version(path: &Path, text: &str) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|error| format!("{} is not JSON: {error}", path.display()))?;
    let version = value["ociVersion"].as_str().unwrap_or_default();
    match version.split('.').next() {
        Some(SPEC_MAJOR) => Ok(()),
        _ => Err(format!(
            "{}: ociVersion is {version:?}, and provm-runtime reads runtime-spec {SPEC_MAJOR}.x: make the bundle with a tool of that version (podman, `runc spec`)",
            path.display()
        )),
    }
}

fn plan(bundle: &Path, spec: &Spec) -> Result<Read, String> {
    let mut warnings = Vec::new();
    let root = spec
        .root()
        .as_ref()
        .ok_or("config.json has no root: give root.path, the container's root directory")?;
    let rootfs = bundle.join(root.path());
    if !rootfs.is_dir() {
        return Err(format!(
            "root.path {} is not a directory: it is the container's root file system",
            rootfs.display()
        ));
    }
    let process = spec
        .process()
        .as_ref()
        .ok_or("config.json has no process: give process.args, the command")?;
    let args = process.args().clone().unwrap_or_default();
    if args.is_empty() {
        return Err("process.args is empty: give the command to run".into());
    }
    let cwd = process.cwd().to_string_lossy().into_owned();
    if !cwd.starts_with('/') {
        return Err(format!("process.cwd {cwd:?} is not an absolute path"));
    }
    ignored_process_fields(process, &mut warnings);
    let user = process.user();
    let mut inputs = Vec::new();
    let mut volumes = Vec::new();
    let mut mount_points = Vec::new();
    for (index, mount) in spec.mounts().iter().flatten().enumerate() {
        match mount_input(bundle, index, mount, &mut warnings)? {
            Some((host, guest, true)) => inputs.push((host, guest)),
            Some((host, guest, false)) => volumes.push((host, guest)),
            None => mount_points.push(mount.destination().clone()),
        }
    }
    if spec.hooks().is_some() {
        warnings.push("hooks: ignored; they would run on the host, not in the VM".into());
    }
    let (cpus, memory_mib) = match spec.linux() {
        Some(linux) => linux_fields(linux, &mut warnings)?,
        None => (None, None),
    };
    Ok(Read {
        plan: Plan {
            rootfs,
            args,
            env: process.env().clone().unwrap_or_default(),
            cwd,
            user: (user.uid() != 0 || user.gid() != 0)
                .then(|| format!("{}:{}", user.uid(), user.gid())),
            hostname: spec.hostname().clone().filter(|name| !name.is_empty()),
            rlimits: process.rlimits().clone().unwrap_or_default(),
            terminal: process.terminal().unwrap_or(false),
            inputs,
            volumes,
            mount_points,
            cpus,
            memory_mib,
            annotations: spec
                .annotations()
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        },
        warnings,
    })
}

/// Linux's number for the resource `kind` (setrlimit(2)). The guest's
/// kernel is x86-64 Linux, as is this host's: libc's constants are its.
pub fn rlimit(limit: &PosixRlimit) -> provm_guest_agent::Rlimit {
    let resource = match limit.typ() {
        PosixRlimitType::RlimitCpu => libc::RLIMIT_CPU,
        PosixRlimitType::RlimitFsize => libc::RLIMIT_FSIZE,
        PosixRlimitType::RlimitData => libc::RLIMIT_DATA,
        PosixRlimitType::RlimitStack => libc::RLIMIT_STACK,
        PosixRlimitType::RlimitCore => libc::RLIMIT_CORE,
        PosixRlimitType::RlimitRss => libc::RLIMIT_RSS,
        PosixRlimitType::RlimitNproc => libc::RLIMIT_NPROC,
        PosixRlimitType::RlimitNofile => libc::RLIMIT_NOFILE,
        PosixRlimitType::RlimitMemlock => libc::RLIMIT_MEMLOCK,
        PosixRlimitType::RlimitAs => libc::RLIMIT_AS,
        PosixRlimitType::RlimitLocks => libc::RLIMIT_LOCKS,
        PosixRlimitType::RlimitSigpending => libc::RLIMIT_SIGPENDING,
        PosixRlimitType::RlimitMsgqueue => libc::RLIMIT_MSGQUEUE,
        PosixRlimitType::RlimitNice => libc::RLIMIT_NICE,
        PosixRlimitType::RlimitRtprio => libc::RLIMIT_RTPRIO,
        PosixRlimitType::RlimitRttime => libc::RLIMIT_RTTIME,
    };
    provm_guest_agent::Rlimit {
        resource,
        soft: limit.soft(),
        hard: limit.hard(),
    }
}

fn ignored_process_fields(process: &Process, warnings: &mut Vec<String>) {
    let mut moot = Vec::new();
    if process.capabilities().is_some() {
        moot.push("capabilities");
    }
    if process.no_new_privileges().is_some() {
        moot.push("noNewPrivileges");
    }
    if process.apparmor_profile().is_some() || process.selinux_label().is_some() {
        moot.push("apparmorProfile/selinuxLabel");
    }
    if process.oom_score_adj().is_some() {
        moot.push("oomScoreAdj");
    }
    if process
        .user()
        .additional_gids()
        .as_ref()
        .is_some_and(|g| !g.is_empty())
    {
        moot.push("user.additionalGids");
    }
    if !moot.is_empty() {
        warnings.push(format!(
            "process.{}: ignored; the command runs alone in its own VM, under the guest's defaults",
            moot.join(", process.")
        ));
    }
}

/// The mounts a VM makes moot: its kernel has its own /proc, /sys and
/// devices, and the engine's own files an engine binds in (/etc/hosts,
/// resolv.conf, hostname, /run/.containerenv, /dev/shm) name the host's
/// network, which the guest does not share.
fn moot_mount(bundle: &Path, mount: &Mount) -> bool {
    const PSEUDO: &[&str] = &[
        "proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2", "tmpfs",
    ];
    const ENGINE_FILES: &[&str] = &[
        "/etc/hosts",
        "/etc/resolv.conf",
        "/etc/hostname",
        "/run/.containerenv",
        "/dev/shm",
    ];
    let destination = mount.destination();
    let system = ["/proc", "/sys", "/dev"]
        .iter()
        .any(|top| destination.starts_with(top));
    let pseudo = mount
        .typ()
        .as_deref()
        .is_some_and(|kind| PSEUDO.contains(&kind));
    let engine_file = ENGINE_FILES
        .iter()
        .any(|file| destination == Path::new(file))
        || mount
            .source()
            .as_ref()
            .is_some_and(|s| s.starts_with(bundle));
    system || pseudo || engine_file
}

/// A mount as a host folder or file for the guest (host path, guest path,
/// whether it is read-only), nothing (moot, with a warning), or a refusal
/// naming it.
fn mount_input(
    bundle: &Path,
    index: usize,
    mount: &Mount,
    warnings: &mut Vec<String>,
) -> Result<Option<(PathBuf, String, bool)>, String> {
    let destination = mount.destination().to_string_lossy().into_owned();
    let field = format!("mounts[{index}] ({destination})");
    if moot_mount(bundle, mount) {
        warnings.push(format!("{field}: ignored; the VM has its own"));
        return Ok(None);
    }
    let options = mount.options().clone().unwrap_or_default();
    let bind = mount.typ().as_deref() == Some("bind")
        || options.iter().any(|o| o == "bind" || o == "rbind");
    if !bind {
        return Err(format!(
            "{field}: a mount of type {:?} cannot be given to a VM; provm-runtime takes host folders (bind mounts) only",
            mount.typ().clone().unwrap_or_default()
        ));
    }
    let source = mount
        .source()
        .clone()
        .ok_or_else(|| format!("{field}: a bind mount with no source"))?;
    let read_only = options.iter().any(|o| o == "ro");
    Ok(Some((source, destination, read_only)))
}

/// The vCPUs and memory `linux.resources` asks for; what else `linux`
/// holds is moot in a VM, or refused.
fn linux_fields(
    linux: &Linux,
    warnings: &mut Vec<String>,
) -> Result<(Option<u8>, Option<u64>), String> {
    if linux.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(
            "linux.devices: a host device cannot be given to the VM; leave --device out".into(),
        );
    }
    let mut moot = Vec::new();
    for (present, name) in [
        (linux.namespaces().is_some(), "namespaces"),
        (linux.seccomp().is_some(), "seccomp"),
        (linux.cgroups_path().is_some(), "cgroupsPath"),
        (linux.masked_paths().is_some(), "maskedPaths"),
        (linux.readonly_paths().is_some(), "readonlyPaths"),
        (linux.sysctl().is_some(), "sysctl"),
        (linux.uid_mappings().is_some(), "uidMappings"),
    ] {
        if present {
            moot.push(name);
        }
    }
    if !moot.is_empty() {
        warnings.push(format!(
            "linux.{}: ignored; the VM isolates the command",
            moot.join(", linux.")
        ));
    }
    let Some(resources) = linux.resources() else {
        return Ok((None, None));
    };
    let cpus = match resources.cpu() {
        Some(cpu) => match (cpu.quota(), cpu.period()) {
            (Some(quota), Some(period)) if quota > 0 && period > 0 => {
                let cpus = (quota as u64).div_ceil(period);
                if cpus > MAX_CPUS {
                    return Err(format!(
                        "linux.resources.cpu: quota {quota} over period {period} is {cpus} CPUs, and a guest has at most {MAX_CPUS}"
                    ));
                }
                Some(cpus as u8)
            }
            _ => {
                warnings.push("linux.resources.cpu: only quota and period give the guest its vCPUs; the rest is ignored".into());
                None
            }
        },
        None => None,
    };
    let memory_mib = match resources.memory().as_ref().and_then(|m| m.limit()) {
        Some(limit) if limit > 0 => {
            let mib = limit as u64 >> 20;
            if mib < MIN_MEMORY_MIB {
                return Err(format!(
                    "linux.resources.memory.limit: {limit} bytes is below the {MIN_MEMORY_MIB} MiB a guest needs; give --memory {MIN_MEMORY_MIB}m or more"
                ));
            }
            Some(mib)
        }
        _ => None,
    };
    if resources.pids().is_some()
        || resources.devices().is_some()
        || resources.block_io().is_some()
        || resources.hugepage_limits().is_some()
        || resources.network().is_some()
    {
        warnings.push("linux.resources: only cpu quota and memory.limit apply to a VM; the other cgroup limits are ignored".into());
    }
    Ok((cpus, memory_mib))
}

#[cfg(test)]
mod tests;
