//! provm-runtime under containerd (Debian 12's 1.6), through provm's shim
//! v2 `containerd-shim-provm-v1`: a containerd of the test's own (its
//! root, state and socket in a scratch folder, the native snapshotter)
//! imports the tests' container image and `ctr run --runtime
//! io.containerd.provm.v1` runs it, with the image's user, folder and
//! environment, piped input, both output streams and the exit status; the
//! trace left replays with no containerd present. A container kept
//! running refuses `ctr task exec`, naming it, and `ctr task kill` signals
//! its command in the guest, whose trace is whole. `ctr run -t` gives the
//! container a terminal. See docs/runtime.md's "With containerd".

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{
    assert_replay_matches, container_image, one_guest_at_a_time, resized_then_typed, scratch,
    terminal::OnATerminal, ON_A_TERMINAL_SIZED,
};

const NAMESPACE: &str = "provm-test";
/// The tests' container image as containerd names `provm/test:1`.
const IMAGE: &str = "docker.io/provm/test:1";
const RUNTIME: &str = "io.containerd.provm.v1";

/// containerd with a configuration, a store and a traces folder of its
/// own, stopped when the test process ends.
struct Containerd {
    dir: PathBuf,
    traces: PathBuf,
    daemon: Child,
}

/// The shim, built beside provm by the workspace's build (scripts/test's).
fn shim() -> PathBuf {
    let shim = Path::new(env!("CARGO_BIN_EXE_provm")).with_file_name("containerd-shim-provm-v1");
    assert!(
        shim.exists(),
        "{} is missing: build it with `cargo build --release -p provm-shim`",
        shim.display()
    );
    shim
}

/// A containerd of the test's own, with the image imported, stopped when
/// the test ends (a daemon shared in a static would outlive the tests).
fn containerd() -> Containerd {
    let containerd = Containerd::start();
    let imported = containerd
        .ctr()
        .args(["images", "import"])
        .arg(&container_image().archive)
        .output()
        .unwrap();
    assert_success("ctr images import", &imported);
    containerd
}

impl Containerd {
    fn start() -> Containerd {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let dir = scratch(module_path!()).join(format!(
            "containerd-{}",
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let traces = dir.join("traces");
        std::fs::create_dir_all(&traces).unwrap();
        let config = dir.join("config.toml");
        std::fs::write(&config, configuration(&dir)).unwrap();
        // containerd finds the shim of `io.containerd.provm.v1` on its
        // PATH, and the shim passes its environment on to the runtime.
        let shim_dir = shim().parent().unwrap().to_owned();
        let path = format!("{}:{}", shim_dir.display(), std::env::var("PATH").unwrap());
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .env("PROVM_RUNTIME_TRACES", &traces)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("containerd: {e}: it is missing; run scripts/install-deps (Debian's containerd)")
            });
        let mut containerd = Containerd {
            dir,
            traces,
            daemon,
        };
        containerd.wait_until_serving();
        containerd
    }

    fn wait_until_serving(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.ctr().arg("version").output().unwrap().status.success() {
            let ended = self.daemon.try_wait().unwrap();
            assert!(
                ended.is_none() && Instant::now() < deadline,
                "containerd did not start ({ended:?}): {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// ctr, talking to this containerd, in the tests' namespace, with the
    /// snapshotter it has.
    fn ctr(&self) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args(["--namespace", NAMESPACE])
            .env("CONTAINERD_SNAPSHOTTER", "native");
        command
    }

    /// `ctr run OPTIONS` of the container `id` of the image, with provm's
    /// runtime, running `script`.
    fn run(&self, options: &[&str], id: &str, script: &str) -> Command {
        let mut command = self.ctr();
        command.arg("run").args(options).args([
            "--runtime",
            RUNTIME,
            IMAGE,
            id,
            "sh",
            "-c",
            script,
        ]);
        command
    }

    /// `ctr ARGS`, which must succeed; its output.
    fn ctr_ok(&self, args: &[&str]) -> String {
        let output = self.ctr().args(args).output().unwrap();
        assert_success(&format!("ctr {args:?}"), &output);
        text(&output.stdout)
    }

    fn trace(&self, id: &str) -> PathBuf {
        self.traces.join(format!("{id}.provm"))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        common::stop_daemon(&mut self.daemon, Duration::from_secs(10));
    }
}

/// containerd's config.toml: everything of it in `dir`. Its CRI plugin,
/// Kubernetes', is left out: ctr does not use it, and it would set up
/// networks. The opt plugin's default folder is /opt/containerd.
fn configuration(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "version = 2
root = \"{dir}/root\"
state = \"{dir}/state\"
disabled_plugins = [\"io.containerd.grpc.v1.cri\"]

[grpc]
  address = \"{dir}/containerd.sock\"

[plugins.\"io.containerd.internal.v1.opt\"]
  path = \"{dir}/opt\"
"
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// Whether anything is mounted under `dir` (a container's root left).
fn mounted_under(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts.contains(dir.to_str().unwrap())
}

#[test]
fn ctr_run_gets_the_containers_streams_and_status_and_its_trace_replays() {
    let _guest = one_guest_at_a_time();
    let containerd = containerd();
    let id = "streams";
    let script = "cat; echo $GREETING from $(pwd) as $(id -u):$(id -g); echo to stderr >&2; exit 3";
    let mut run = containerd
        .run(&["--rm"], id, script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    run.stdin.take().unwrap().write_all(b"piped in\n").unwrap();
    let output = run.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(3),
        "{}\n{}",
        text(&output.stderr),
        containerd.log()
    );
    // The image's Env, WorkingDir and User, as ctr put them in the bundle.
    assert_eq!(
        text(&output.stdout),
        "piped in\nhello from /work as 1000:100\n"
    );
    assert_eq!(text(&output.stderr), "to stderr\n");
    // `--rm` deleted the container: nothing is left of it, nor mounted.
    assert_eq!(containerd.ctr_ok(&["containers", "list", "--quiet"]), "");
    assert!(!mounted_under(&containerd.dir));
    let replayed = assert_replay_matches(&containerd.trace(id));
    assert!(replayed.contains("the exit status"), "{replayed}");
}

/// `ctr run -t`, typed at in a terminal: the shim takes the terminal the
/// runtime makes, the command's terminal in the guest follows the size of
/// ctr's (ctr's resize, the shim's `ResizePty`, the runtime's SIGWINCH),
/// what is typed reaches the command as it runs, its output comes back
/// through the terminal, and the trace replays.
#[test]
fn ctr_run_t_gives_the_container_a_terminal() {
    let _guest = one_guest_at_a_time();
    let containerd = containerd();
    let id = "terminal";
    let run = containerd.run(&["-t", "--rm"], id, ON_A_TERMINAL_SIZED);
    let (status, output) = resized_then_typed(OnATerminal::spawn(run, 24, 80));
    assert_eq!(status, Some(0), "{output}\n{}", containerd.log());
    assert_replay_matches(&containerd.trace(id));
}

#[test]
fn exec_is_refused_by_name_and_kill_signals_the_command_in_the_guest() {
    let _guest = one_guest_at_a_time();
    let containerd = containerd();
    let id = "killed";
    let log = containerd.dir.join("killed.log");
    let log_uri = format!("file://{}", log.display());
    let run = containerd
        .run(
            &["--detach", "--log-uri", &log_uri],
            id,
            "echo started; exec sleep 600",
        )
        .output()
        .unwrap();
    assert_success("ctr run --detach", &run);
    let exec = containerd
        .ctr()
        .args(["tasks", "exec", "--exec-id", "second", id, "true"])
        .output()
        .unwrap();
    assert!(!exec.status.success());
    assert!(
        text(&exec.stderr).contains("exec is not supported by provm's runtime"),
        "{}",
        text(&exec.stderr)
    );
    // Once the guest runs the command, SIGTERM goes to it there.
    let deadline = Instant::now() + Duration::from_secs(300);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("started")
    {
        assert!(
            Instant::now() < deadline,
            "the container never said it started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    containerd.ctr_ok(&["tasks", "kill", id]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !containerd.ctr_ok(&["tasks", "list"]).contains("STOPPED") {
        assert!(Instant::now() < deadline, "the container did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    containerd.ctr_ok(&["tasks", "delete", id]);
    containerd.ctr_ok(&["containers", "delete", id]);
    let trace = containerd.trace(id);
    let replayed = assert_replay_matches(&trace);
    assert!(replayed.contains("the exit status"), "{replayed}");
    let inspected = common::provm(&["inspect", common::path(&trace)]);
    assert!(
        inspected.stdout.contains("the command ended: Signaled(15)"),
        "{}",
        inspected.stdout
    );
}
