//! provm-runtime under the real Docker (Debian 12's docker.io 20.10, with
//! the containerd it starts): dockerd, started by the test with a
//! configuration, a store and a socket of its own, runs containers with
//! `--runtime provm`, through containerd's runc shim, which calls
//! provm-runtime's runc command line. The command's output and exit status
//! come back, `docker stop` signals the command in the guest, and each
//! container leaves a trace that `provm replay` re-executes. The image is
//! the Podman tests' busybox root, imported, so that it shares their disk
//! and booted guest.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_replay_matches, one_guest_at_a_time};

const IMAGE: &str = "localhost/provm-busybox:docker";

/// dockerd, with everything of its own under `dir`.
struct Docker {
    dir: PathBuf,
    daemon: Child,
}

impl Docker {
    /// Starts dockerd with `runtime` as its runtime `provm`, recording into
    /// `traces`: the vfs store (no overlay mounts needed), no bridge and no
    /// iptables rules (the containers use `--network none`), cgroupfs (this
    /// host has cgroups v1 and no systemd).
    fn start(runtime: &Path, dir: &Path, traces: &Path) -> Docker {
        std::fs::create_dir_all(dir).unwrap();
        let config = serde_json::json!({
            "runtimes": {"provm": {"path": runtime}},
            "storage-driver": "vfs",
            "bridge": "none",
            "iptables": false,
            "ip6tables": false,
            "exec-opts": ["native.cgroupdriver=cgroupfs"],
        });
        std::fs::write(dir.join("daemon.json"), config.to_string()).unwrap();
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        // containerd's shim passes dockerd's environment on to the runtime.
        let daemon = Command::new("dockerd")
            .env("PROVM_RUNTIME_TRACES", traces)
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("dockerd: {e} (run scripts/install-deps)"));
        let docker = Docker {
            dir: dir.to_owned(),
            daemon,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !docker
            .command()
            .arg("info")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            assert!(
                Instant::now() < deadline,
                "dockerd did not answer in 60 s\n{}",
                docker.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        docker
    }

    fn command(&self) -> Command {
        let mut command = Command::new("docker");
        command.env(
            "DOCKER_HOST",
            format!("unix://{}", self.dir.join("docker.sock").display()),
        );
        command
    }

    /// `docker ARGS`, which must exit with `status`: its output.
    fn expect(&self, args: &[&str], status: i32) -> Output {
        let output = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(status),
            "docker {args:?}: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        output
    }

    fn stdout(&self, args: &[&str]) -> String {
        String::from_utf8(self.expect(args, 0).stdout).unwrap()
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
        format!("--- dockerd.log\n{log}")
    }
}

impl Drop for Docker {
    /// SIGTERM, which stops dockerd's containers and its containerd; SIGKILL
    /// if it is still there 20 s on.
    fn drop(&mut self) {
        common::stop_daemon(&mut self.daemon, Duration::from_secs(20));
    }
}

#[test]
fn docker_runs_a_recorded_container_and_docker_stop_signals_its_command() {
    let _guest = one_guest_at_a_time();
    let runtime = crate::runtime::binary();
    let scratch = common::scratch(module_path!());
    let traces = scratch.join("traces");
    let docker = Docker::start(&runtime, &scratch.join("docker"), &traces);
    let tar = crate::runtime::image_tar(&scratch);
    docker.expect(&["import", tar.to_str().unwrap(), IMAGE], 0);

    let provm = ["--runtime", "provm", "--network", "none"];
    let ran = docker.expect(
        &[
            &["run", "--rm"],
            &provm[..],
            &[IMAGE, "sh", "-c", "echo hello from docker; exit 3"],
        ]
        .concat(),
        3,
    );
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "hello from docker\n");

    let trapping = "trap 'echo got TERM; exit 7' TERM; echo started; while :; do sleep 1; done";
    let id = docker.stdout(&[&["run", "-d"], &provm[..], &[IMAGE, "sh", "-c", trapping]].concat());
    let id = id.trim();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !docker.stdout(&["logs", id]).contains("started") {
        assert!(Instant::now() < deadline, "no output\n{}", docker.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    docker.expect(&["stop", "-t", "60", id], 0);
    let status = docker.stdout(&["inspect", "--format", "{{.State.ExitCode}}", id]);
    assert_eq!(status.trim(), "7", "the command's trap ended it");
    assert_eq!(docker.stdout(&["logs", id]), "started\ngot TERM\n");
    docker.expect(&["rm", id], 0);

    let mut recorded: Vec<PathBuf> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    recorded.sort();
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert!(recorded.contains(&traces.join(format!("{id}.provm"))));
    for trace in &recorded {
        let replayed = assert_replay_matches(trace);
        assert!(replayed.contains("the exit status"), "{replayed}");
    }
}
