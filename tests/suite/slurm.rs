//! provm-runtime under Slurm 22.05 (Debian 12's slurm-wlm, with munge):
//! a cluster of this one host, started by the test from configuration
//! files of its own, runs `srun --container=BUNDLE` through oci.conf's
//! `RunTimeRun`, as a job array of 8 tasks; each task's container prints
//! what its parameter gives and leaves a trace, named by its container id,
//! that `provm inspect` verifies and `provm replay` re-executes with no
//! Slurm present. See docs/runtime.md's "With Slurm".

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_replay_matches, free_port, one_guest_at_a_time, path, provm};

const TASKS: u32 = 8;

/// munged, slurmctld and slurmd for this host, stopped when dropped
/// (a failing test included), with every file of theirs in `dir`.
struct Slurm {
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
}

impl Slurm {
    /// Starts the daemons with oci.conf's commands running `runtime`,
    /// whose traces go to `traces`; returns once the node takes jobs.
    fn start(runtime: &Path, traces: &Path) -> Slurm {
        assert_eq!(
            // SAFETY: geteuid(2) reads the process's user id.
            unsafe { libc::geteuid() },
            0,
            "this test needs root (as CI has): slurmd starts jobs as their users"
        );
        let dir = tempfile::tempdir().unwrap();
        // munged serves its socket only from a folder everyone can search.
        set_mode(dir.path(), 0o755);
        let mut slurm = Slurm {
            dir,
            daemons: Vec::new(),
        };
        slurm.start_munge();
        slurm.write_configuration(runtime, traces);
        for daemon in ["slurmctld", "slurmd"] {
            let mut command = slurm.command(&format!("/usr/sbin/{daemon}"));
            command.arg("-D");
            slurm.spawn(daemon, command);
        }
        slurm.wait_until_idle();
        slurm
    }

    /// Starts the daemon `name` (in the foreground, so that it is our
    /// child to stop), its standard error into `NAME.err`.
    fn spawn(&mut self, name: &str, mut command: Command) {
        let stderr = std::fs::File::create(self.file(&format!("{name}.err"))).unwrap();
        let child = command
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e} (run scripts/install-deps)"));
        self.daemons.push(child);
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A Slurm command that reads this cluster's slurm.conf.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.file("slurm.conf"));
        command
    }

    /// munged with a key and a socket of its own (slurm.conf's AuthInfo
    /// names the socket), so that a machine's own munged, if any, is not
    /// needed nor disturbed.
    fn start_munge(&mut self) {
        let key = self.file("munge.key");
        let mut bytes = Vec::new();
        let urandom = std::fs::File::open("/dev/urandom").unwrap();
        urandom.take(1024).read_to_end(&mut bytes).unwrap();
        std::fs::write(&key, bytes).unwrap();
        set_mode(&key, 0o400);
        let socket = self.file("munge.socket");
        let mut munged = Command::new("/usr/sbin/munged");
        munged
            .arg("--foreground")
            .arg(format!("--socket={}", socket.display()));
        for (option, file) in [
            ("key-file", "munge.key"),
            ("pid-file", "munged.pid"),
            ("log-file", "munged.log"),
            ("seed-file", "munged.seed"),
        ] {
            munged.arg(format!("--{option}={}", self.file(file).display()));
        }
        self.spawn("munged", munged);
        wait_for("munged's socket", || socket.exists(), || self.logs());
    }

    fn write_configuration(&self, runtime: &Path, traces: &Path) {
        let host = host();
        let dir = self.dir.path().display();
        for folder in ["state", "spool"] {
            std::fs::create_dir(self.file(folder)).unwrap();
        }
        let slurm_conf = format!(
            "ClusterName=provmtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
# No systemd and cgroups v1 here (PLATFORM.md): processes are tracked by
# their parents, and tasks are not bound to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
# An array's next task starts as soon as one ends, not 3 s later.
SchedulerParameters=batch_sched_delay=0
# `sbatch --wait` polls after 2 s, then 8 s later, then every 32 s, unless
# a job's record is kept less than twice as long (MinJobAge, 300 s by
# default): kept 10 s, it polls every 8 s, and sees each task's record
# before it goes, so its status is still every task's.
MinJobAge=10
# One CPU, so one task at a time: two PVM guests side by side slow each
# other more than twofold on this kind of host (common::one_guest_at_a_time).
NodeName={host} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=provm Nodes={host} Default=YES MaxTime=INFINITE State=UP
",
            ctld_port = free_port(),
            slurmd_port = free_port(),
        );
        std::fs::write(self.file("slurm.conf"), slurm_conf).unwrap();
        std::fs::write(
            self.file("oci.conf"),
            oci_conf(runtime, &self.file("runtime"), traces),
        )
        .unwrap();
    }

    fn wait_until_idle(&self) {
        wait_for(
            "the node to take jobs",
            || {
                let state = self.command("sinfo").args(["-h", "-o", "%T"]).output();
                state.is_ok_and(|state| String::from_utf8_lossy(&state.stdout).trim() == "idle")
            },
            || self.logs(),
        );
    }

    /// The daemons' logs, for a failure's message.
    fn logs(&self) -> String {
        [
            "munged.log",
            "munged.err",
            "slurmctld.log",
            "slurmctld.err",
            "slurmd.log",
            "slurmd.err",
        ]
        .iter()
        .map(|name| {
            let text = std::fs::read_to_string(self.file(name)).unwrap_or_default();
            format!("--- {name}\n{text}")
        })
        .collect()
    }
}

impl Drop for Slurm {
    /// Cancels what still runs, then stops the daemons, the last started
    /// first: each gets SIGTERM, and SIGKILL if it is still there 10 s on.
    fn drop(&mut self) {
        let _ = self.command("scancel").args(["--user", "root"]).status();
        for daemon in self.daemons.iter_mut().rev() {
            common::stop_daemon(daemon, Duration::from_secs(10));
        }
    }
}

/// oci.conf: Slurm runs each step's container with `RunTimeRun` (create
/// then start left the step hanging, PLATFORM.md), through a shell, so
/// that `env` can give the runtime its traces' folder. The container's id
/// is the node's, the user's, the job's, the step's and the task's.
fn oci_conf(runtime: &Path, state: &Path, traces: &Path) -> String {
    let runtime = format!("{} --root={}", runtime.display(), state.display());
    let id = "%n.%u.%j.%s.%t";
    format!(
        "RunTimeQuery=\"{runtime} state {id}\"
RunTimeKill=\"{runtime} kill --all {id}\"
RunTimeDelete=\"{runtime} delete --force {id}\"
RunTimeRun=\"env PROVM_RUNTIME_TRACES={traces} {runtime} run {id} --bundle %b\"
",
        traces = traces.display()
    )
}

/// This host's name without its domain: slurmd's node name, and
/// slurmctld's, which must match SlurmctldHost.
fn host() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    name.trim().split('.').next().unwrap().to_owned()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Waits up to 30 s for `ready`; fails naming `what`, with `logs()`.
fn wait_for(what: &str, mut ready: impl FnMut() -> bool, logs: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "waited 30 s for {what}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_job_array_runs_each_task_in_a_recorded_container() {
    let _guest = one_guest_at_a_time();
    let began = Instant::now();
    let runtime = crate::runtime::binary();
    let scratch = common::scratch(module_path!());
    let traces = scratch.join("traces");
    let slurm = Slurm::start(&runtime, &traces);
    // Slurm 22.05 gives the runtime a config.json of its own whose root
    // is the bundle's `rootfs`, whatever root.path says.
    let bundle = crate::runtime::bundle(&scratch.join("bundle"), &["sh"]);
    let out = scratch.join("out");
    std::fs::create_dir(&out).unwrap();
    // The task's parameter is its index in the array, which the batch
    // script's shell expands into the container's command.
    let wrap = format!(
        "srun --container={} sh -c 'echo task $1: $(($1 * $1)) in job $SLURM_JOB_ID' task $SLURM_ARRAY_TASK_ID",
        bundle.display()
    );
    let started = Instant::now();
    let mut sbatch = slurm
        .command("sbatch")
        .arg(format!("--array=0-{}", TASKS - 1))
        .arg("--wait")
        .arg(format!("--output={}/%a.out", out.display()))
        .arg(format!("--error={}/%a.err", out.display()))
        .args(["--wrap", &wrap])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("sbatch: {e} (run scripts/install-deps)"));
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(status) = sbatch.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the job array ran for 600 s\n{}",
            slurm.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let ran = started.elapsed();
    let task_output = |task: u32, stream: &str| {
        std::fs::read_to_string(out.join(format!("{task}.{stream}"))).unwrap_or_default()
    };
    let all_errors: String = (0..TASKS).map(|task| task_output(task, "err")).collect();
    assert!(
        status.success(),
        "sbatch: {status}\n{all_errors}\n{}",
        slurm.logs()
    );
    for task in 0..TASKS {
        let printed = task_output(task, "out");
        let job = printed
            .strip_prefix(&format!("task {task}: {} in job ", task * task))
            .and_then(|rest| rest.strip_suffix('\n'))
            .unwrap_or_else(|| panic!("task {task} printed {printed:?}\n{all_errors}"));
        // Its container's trace, named by the container's id, verified.
        let id = format!("{}.root.{job}.0.0", host());
        let trace = traces.join(format!("{id}.provm"));
        let inspected = provm(&["inspect", path(&trace)]);
        assert_eq!(inspected.status, 0, "{}", inspected.stderr);
        assert!(inspected.stdout.contains(&id), "{}", inspected.stdout);
        if task == TASKS - 1 {
            let replayed = assert_replay_matches(&trace);
            assert!(replayed.contains("the exit status"), "{replayed}");
        }
    }
    assert_eq!(std::fs::read_dir(&traces).unwrap().count(), TASKS as usize);
    sweep_is_one_dataset(&traces, &scratch.join("sweep"));
    eprintln!(
        "slurm: the job array ran in {:.1} s, the whole test took {:.1} s",
        ran.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
}

/// The array's traces exported into one Parquet dataset answer one
/// question across the sweep in DuckDB: each task's parameter (its
/// command's last argument), beside its run's events and the guest time.
fn sweep_is_one_dataset(traces: &Path, dataset: &Path) {
    let mut all: Vec<String> = std::fs::read_dir(traces)
        .unwrap()
        .map(|entry| entry.unwrap().path().display().to_string())
        .collect();
    all.sort();
    let runs: Vec<&str> = all.iter().map(String::as_str).collect();
    crate::parquet::export(&runs, dataset);
    let rows = crate::parquet::duckdb(&format!(
        "SELECT json_extract_string(m.argv, '$[-1]')::INTEGER AS parameter, \
                count(*) AS events, any_value(m.guest_ns) > 0 AS timed \
         FROM {} AS m JOIN {} AS e USING (run) GROUP BY parameter ORDER BY parameter",
        crate::parquet::dataset(dataset, "manifest"),
        crate::parquet::dataset(dataset, "events"),
    ));
    let parameters: Vec<i64> = rows.iter().filter_map(|row| row[0].as_i64()).collect();
    assert_eq!(
        parameters,
        (0..i64::from(TASKS)).collect::<Vec<_>>(),
        "{rows:?}"
    );
    for row in &rows {
        assert!(
            row[1].as_i64().is_some_and(|events| events > 100),
            "{rows:?}"
        );
        assert_eq!(row[2].as_bool(), Some(true), "{rows:?}");
    }
}
