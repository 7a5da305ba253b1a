//! provm-runtime under the real Podman (Debian 12's 4.3.1, with conmon):
//! a container's standard input and output, its exit status, `-e`, `-w`,
//! a read-only volume, a terminal (`-t`), recording turned off by an
//! annotation, and `podman stop`; each recorded container leaves a trace
//! that `provm replay` re-executes with no container engine. The image is
//! the tests' busybox root, imported (no registry is reachable); Podman
//! keeps its store in a scratch folder, and runs with cgroupfs and the
//! rlimits this host allows (see docs/runtime.md). Podman unpacks the
//! same image into the same tree, so every container shares one disk and
//! its booted guest's snapshot. `run` alone, as Slurm's `RunTimeRun`
//! uses it, is tested here too (and under Slurm in slurm.rs).

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    assert_replay_cut_short, assert_replay_matches, fed_while_it_runs, images, one_guest_at_a_time,
    path, provm, resized_then_typed, scratch, spawn_piped, terminal::OnATerminal,
    ON_A_TERMINAL_SIZED,
};

const IMAGE: &str = "localhost/provm-busybox:test";

/// Podman with a store, a configuration and a traces folder of its own.
struct Podman {
    dir: PathBuf,
    traces: PathBuf,
    runtime: PathBuf,
}

/// provm-runtime, built beside provm by the workspace's build (scripts/test's).
pub fn binary() -> PathBuf {
    let runtime = Path::new(env!("CARGO_BIN_EXE_provm")).with_file_name("provm-runtime");
    assert!(
        runtime.exists(),
        "{} is missing: build it with `cargo build --release -p provm-runtime`",
        runtime.display()
    );
    runtime
}

/// A bundle at `dir` of the tests' busybox root, at `rootfs` as a link to
/// the shared tree (the same bytes on every run, so that its disk and
/// booted guest are cached), running `args`.
pub fn bundle(dir: &Path, args: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::symlink(&images().root, dir.join("rootfs")).unwrap();
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "cwd": "/"
        },
        "root": {"path": "rootfs"}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir.to_owned()
}

fn podman() -> &'static Podman {
    static PODMAN: OnceLock<Podman> = OnceLock::new();
    PODMAN.get_or_init(|| {
        let runtime = binary();
        let dir = scratch(module_path!()).join("podman");
        let traces = dir.join("traces");
        std::fs::create_dir_all(&traces).unwrap();
        // conmon, which starts the runtime, passes on only the environment
        // the configuration names.
        let mut environment = vec![
            format!("PATH={}", std::env::var("PATH").unwrap()),
            format!("PROVM_RUNTIME_TRACES={}", traces.display()),
        ];
        for variable in ["HOME", "PROVM_CACHE", "XDG_CACHE_HOME"] {
            if let Ok(value) = std::env::var(variable) {
                environment.push(format!("{variable}={value}"));
            }
        }
        let quoted: Vec<String> = environment.iter().map(|e| format!("{e:?}")).collect();
        std::fs::write(
            dir.join("containers.conf"),
            format!("[engine]\nconmon_env_vars = [{}]\n", quoted.join(", ")),
        )
        .unwrap();
        let podman = Podman {
            dir,
            traces,
            runtime,
        };
        let tar = image_tar(&podman.dir);
        let imported = podman
            .command()
            .args(["import"])
            .arg(&tar)
            .arg(IMAGE)
            .output();
        let imported =
            imported.unwrap_or_else(|e| panic!("podman: {e} (run scripts/install-deps)"));
        assert!(
            imported.status.success(),
            "{}",
            String::from_utf8_lossy(&imported.stderr)
        );
        podman
    })
}

/// The tests' busybox root with an /etc/passwd and /etc/group that name
/// the user `--user` gives: in a root without them, Podman writes its own
/// into each container's root, which then makes a disk of its own and
/// boots anew. Fixed times, so that every test run's image is the same
/// and shares one disk and its booted guest.
/// The image the engines import, in `dir`: `root_with_users` as a tar.
pub fn image_tar(dir: &Path) -> PathBuf {
    let tar = dir.join("busybox.tar");
    let packed = Command::new("tar")
        .arg("-C")
        .arg(root_with_users(dir))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(packed.success());
    tar
}

fn root_with_users(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&images().root)
        .arg(&root)
        .status()
        .unwrap();
    assert!(copied.success());
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let files = [
        (
            "passwd",
            "root:x:0:0::/root:/bin/sh\napp:x:1000:100::/tmp:/bin/sh\n",
        ),
        ("group", "root:x:0:\nusers:x:100:\n"),
    ];
    let fixed = std::time::UNIX_EPOCH + Duration::from_secs(946_684_800);
    for (name, content) in files {
        let path = etc.join(name);
        std::fs::write(&path, content).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(fixed)
            .unwrap();
    }
    root
}

impl Podman {
    fn command(&self) -> Command {
        let mut command = Command::new("podman");
        command
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--cgroup-manager=cgroupfs")
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"));
        command
    }

    /// `podman run` of `args` (options, then the image and command) with
    /// provm-runtime, `stdin` written to it; its output and the id of the
    /// container it ran.
    fn run(&self, args: &[&str], stdin: &[u8]) -> (Output, String) {
        let (mut child, cidfile) = self.start(args);
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let output = child.wait_with_output().unwrap();
        (output, self.id(&cidfile))
    }

    /// `podman run` of `args` started, its standard streams piped; the
    /// file that will hold the container's id.
    fn start(&self, args: &[&str]) -> (Child, PathBuf) {
        let (mut run, cidfile) = self.run_command(args);
        (spawn_piped(&mut run), cidfile)
    }

    /// The `podman run` of `args`, and the file that will hold the
    /// container's id.
    fn run_command(&self, args: &[&str]) -> (Command, PathBuf) {
        let cidfile = self.dir.join(format!("cid-{}", unique()));
        let mut run = self.command();
        run.arg("run")
            .arg("--runtime")
            .arg(&self.runtime)
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(["--network", "none", "--cidfile"])
            .arg(&cidfile)
            .args(args);
        (run, cidfile)
    }

    fn id(&self, cidfile: &Path) -> String {
        let id = std::fs::read_to_string(cidfile).unwrap_or_default();
        id.trim().to_owned()
    }

    fn trace(&self, id: &str) -> PathBuf {
        self.traces.join(format!("{id}.provm"))
    }

    fn output(&self, args: &[&str]) -> String {
        let output = self.command().args(args).output().unwrap();
        assert!(
            output.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until the container `id`'s output (either stream) holds
    /// `text`, for a few minutes at most.
    fn wait_for_log(&self, id: &str, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let logs = self.command().args(["logs", id]).output().unwrap();
            if [&logs.stdout, &logs.stderr]
                .iter()
                .any(|stream| String::from_utf8_lossy(stream).contains(text))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the container never wrote {text:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Its host name and resource limits too, set in the guest as runc sets
/// them in the container (`--ulimit` beside the tests' own nofile and
/// nproc ones).
#[test]
fn a_container_gets_its_input_environment_folder_and_volume_and_its_trace_replays() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let volume = podman.dir.join("volume");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::write(volume.join("data.txt"), "from the host\n").unwrap();
    let mount = format!("{}:/data:ro", volume.display());
    let script = "cat; echo $GREETING; pwd; cat /data/data.txt; id -u; hostname; \
                  grep 'Max file locks' /proc/self/limits | tr -s ' '; exit 3";
    let (output, id) = podman.run(
        &[
            "-i",
            "--rm",
            "--hostname",
            "box",
            "--ulimit",
            "locks=77:88",
            "-e",
            "GREETING=hello",
            "-w",
            "/tmp",
            "-v",
            &mount,
            IMAGE,
            "sh",
            "-c",
            script,
        ],
        b"piped in\n",
    );
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "piped in\nhello\n/tmp\nfrom the host\n0\nbox\nMax file locks 77 88 locks \n"
    );
    let trace = podman.trace(&id);
    assert!(trace.exists(), "no trace {}", trace.display());
    let replayed = assert_replay_matches(&trace);
    assert!(replayed.contains("the exit status"), "{replayed}");
    // The trace names the command and the root it ran on.
    let inspected = provm(&["inspect", path(&trace)]);
    assert_eq!(inspected.status, 0, "{}", inspected.stderr);
    assert!(inspected.stdout.contains(&id), "{}", inspected.stdout);
    assert!(
        inspected.stdout.contains("root directory sha256:"),
        "{}",
        inspected.stdout
    );
    // Its exit timing, as `provm record` keeps it: blame names the command.
    let blamed = provm(&["blame", path(&trace)]);
    assert_eq!(blamed.status, 0, "{}", blamed.stderr);
    assert!(blamed.stdout.contains(" sh "), "{}", blamed.stdout);
}

/// A read-write volume (`-v HOST:GUEST`): its folder goes in, and what the
/// command left there comes back to the host's folder at exit (a file
/// written, one removed), as runc's container would have left it; the
/// replay makes the same folder again. Also one large enough to go on the
/// input disk, which the guest copies to make it writable.
#[test]
fn a_read_write_volume_comes_back_at_exit() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let volume = podman.dir.join("read-write");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::write(volume.join("in.txt"), "in\n").unwrap();
    std::fs::write(volume.join("gone.txt"), "gone\n").unwrap();
    let mount = format!("{}:/work", volume.display());
    let script = "cat /work/in.txt; echo out > /work/out.txt; rm /work/gone.txt";
    let (output, id) = podman.run(&["--rm", "-v", &mount, IMAGE, "sh", "-c", script], b"");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "in\n");
    let read = |name: &str| std::fs::read_to_string(volume.join(name)).ok();
    assert_eq!(read("in.txt").as_deref(), Some("in\n"));
    assert_eq!(read("out.txt").as_deref(), Some("out\n"));
    assert_eq!(read("gone.txt"), None);
    let replayed = assert_replay_matches(&podman.trace(&id));
    assert!(replayed.contains("/work"), "{replayed}");

    let large = podman.dir.join("read-write-large");
    std::fs::create_dir_all(&large).unwrap();
    std::fs::write(large.join("large.txt"), vec![b'x'; 100 << 10]).unwrap();
    let mount = format!("{}:/work", large.display());
    let script = "wc -c < /work/large.txt; echo more >> /work/large.txt";
    let (output, id) = podman.run(&["--rm", "-v", &mount, IMAGE, "sh", "-c", script], b"");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), (100 << 10).to_string());
    let grown = std::fs::metadata(large.join("large.txt")).unwrap().len();
    assert_eq!(grown, (100 << 10) + 5);
    assert_replay_matches(&podman.trace(&id));
}

#[test]
fn a_terminal_and_a_user_and_recording_turned_off() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let (output, id) = podman.run(
        &[
            "-t",
            "--rm",
            "--user",
            "1000:100",
            "--annotation",
            "run.provm.record=false",
            IMAGE,
            "sh",
            "-c",
            "echo uid $(id -u):$(id -g)",
        ],
        b"",
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // Through the terminal, whose line discipline ends lines with CR LF.
    assert_eq!(text(&output.stdout), "uid 1000:100\r\n");
    assert!(!podman.trace(&id).exists());
}

/// `scripts/install-node` puts provm, the runtime and the shim where the
/// engines find them, the very files the build made, and builds both
/// guest kernels (here already built, so it only finds them).
#[test]
fn a_node_is_made_ready_in_one_step() {
    let prefix = scratch(module_path!()).join("node");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-node");
    let installed = Command::new(script).arg(&prefix).output().unwrap();
    assert!(installed.status.success(), "{}", text(&installed.stderr));
    let built = binary().with_file_name("");
    for program in ["provm", "provm-runtime", "containerd-shim-provm-v1"] {
        let copy = prefix.join("bin").join(program);
        assert!(
            std::fs::read(&copy).unwrap() == std::fs::read(built.join(program)).unwrap(),
            "{program} differs from the build's"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "{program} is not executable");
    }
    for variant in [&["kernel", "path"][..], &["kernel", "path", "--smp"]] {
        let found = provm(variant);
        assert_eq!(found.status, 0, "{variant:?}: {}", found.stderr);
    }
    // Nothing built to install from: the error names the build.
    let empty = scratch(module_path!()).join("no-build");
    std::fs::create_dir_all(empty.join("scripts")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-node"),
        empty.join("scripts/install-node"),
    )
    .unwrap();
    let refused = Command::new(empty.join("scripts/install-node"))
        .arg(empty.join("prefix"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("build it first with cargo build --release"),
        "{}",
        text(&refused.stderr)
    );
    assert!(!empty.join("prefix").exists());
}

/// What the command writes to its root comes back to the bundle's root
/// directory when it exits, as a runc container's writes land there:
/// `podman diff` lists them, and a container that writes nothing shows
/// what it shows under runc.
#[test]
fn writes_to_the_root_show_in_podman_diff() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let (output, id) = podman.run(
        &[
            IMAGE,
            "sh",
            "-c",
            "echo made > /made.txt && mkdir /new-dir && rm /bin/sync",
        ],
        b"",
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let diff = podman.output(&["diff", &id]);
    eprintln!("podman diff:\n{diff}");
    for line in ["A /made.txt", "A /new-dir", "D /bin/sync"] {
        assert!(diff.lines().any(|l| l == line), "no {line:?} in:\n{diff}");
    }
    let rootfs = podman.output(&["mount", &id]);
    let made = std::fs::read_to_string(Path::new(rootfs.trim()).join("made.txt")).unwrap();
    assert_eq!(made, "made\n");
    let (output, quiet) = podman.run(&[IMAGE, "true"], b"");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // Only what Podman makes in every container's /etc (the mount points
    // of its hosts file and kin): runc's `podman diff` of `true` is the same.
    assert_eq!(podman.output(&["diff", &quiet]), "C /etc\n");
    podman.output(&["rm", &id, &quiet]);
}

/// `podman stop` sends SIGTERM to the container's process, which passes
/// it on to the command in the guest: the command's trap runs there, the
/// recording ends with the command, and its replay sends the signal at the
/// same place and matches to the end.
#[test]
fn podman_stop_signals_the_command_in_the_guest_and_its_trace_replays_whole() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let trapping = "trap 'echo got TERM; exit 7' TERM; echo started; while :; do sleep 1; done";
    let (output, id) = podman.run(&["-d", IMAGE, "sh", "-c", trapping], b"");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    podman.wait_for_log(&id, "started");
    podman.output(&["stop", "-t", "60", &id]);
    let status = podman.output(&["inspect", "--format", "{{.State.ExitCode}}", &id]);
    assert_eq!(status.trim(), "7", "the command's trap ended it");
    assert_eq!(podman.output(&["logs", &id]), "started\ngot TERM\n");
    podman.output(&["rm", &id]);
    let trace = podman.trace(&id);
    let replayed = assert_replay_matches(&trace);
    assert!(replayed.contains("the exit status"), "{replayed}");
    // The signal is the host's input between the job and the power-off.
    let inputs = provm(&[
        "query",
        "--format",
        "csv",
        path(&trace),
        "SELECT count(*) FROM events WHERE kind = 'agent input'",
    ]);
    assert_eq!(inputs.stdout, "count(*)\n3\n", "{}", inputs.stderr);
    eprintln!("{replayed}");
}

/// `podman stop` of a container whose recording is turned off: the
/// signal goes to the command in the guest all the same (a live run stops
/// for it right after an exit, as a recording does), with one vCPU and
/// with two side by side.
#[test]
fn podman_stop_signals_the_command_when_recording_is_turned_off() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let trapping = "trap 'echo got TERM; exit 7' TERM; echo started; while :; do sleep 1; done";
    for cpus in ["1", "2"] {
        let (output, id) = podman.run(
            &[
                "-d",
                "--cpus",
                cpus,
                "--annotation",
                "run.provm.record=false",
                IMAGE,
                "sh",
                "-c",
                trapping,
            ],
            b"",
        );
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        podman.wait_for_log(&id, "started");
        podman.output(&["stop", "-t", "60", &id]);
        let status = podman.output(&["inspect", "--format", "{{.State.ExitCode}}", &id]);
        assert_eq!(
            status.trim(),
            "7",
            "{cpus} vCPUs: the command's trap ended it"
        );
        assert_eq!(podman.output(&["logs", &id]), "started\ngot TERM\n");
        podman.output(&["rm", &id]);
        assert!(!podman.trace(&id).exists());
    }
}

/// `podman rm --force --time 0` kills the container's process outright
/// (SIGKILL), as an engine's time limit or a lost node does: its recording
/// cannot finish, and the runtime's `delete` makes its trace of what it
/// had written (`provm recover`'s work), which replays to there.
#[test]
fn a_container_killed_outright_leaves_a_trace_that_replays_to_there() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let (output, id) = podman.run(
        &["-d", IMAGE, "sh", "-c", common::SERIAL_LINES_FOR_EVER],
        b"",
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    podman.wait_for_log(&id, "200 lines");
    podman.output(&["rm", "--force", "--time", "0", &id]);
    let trace = podman.trace(&id);
    assert_recovered_after_a_kill(&trace);
}

/// `trace` was made of what a killed recording wrote, and replays to there.
fn assert_recovered_after_a_kill(trace: &Path) {
    let inspected = provm(&["inspect", path(trace)]);
    assert!(
        inspected
            .stdout
            .contains("the recording process was killed"),
        "{}{}",
        inspected.stdout,
        inspected.stderr
    );
    assert_replay_cut_short(trace);
}

/// `run` (Slurm's `RunTimeRun`) whose container's process is killed
/// outright, as an engine's SIGKILL of a step's processes or the OOM
/// killer does: `run` ends with 128 + 9 and makes the trace of what the
/// recording had written, as `delete` does (Slurm calls no `delete`).
#[test]
fn run_leaves_a_trace_of_a_container_process_killed_outright() {
    use std::io::{BufRead, BufReader};
    let _guest = one_guest_at_a_time();
    let dir = scratch(module_path!()).join("run-killed");
    let bundle = bundle(
        &dir.join("bundle"),
        &["sh", "-c", common::SERIAL_LINES_FOR_EVER],
    );
    let (traces, pid_file) = (dir.join("traces"), dir.join("pid"));
    let mut run = Command::new(binary())
        .arg("--root")
        .arg(dir.join("state"))
        .arg("run")
        .arg("--pid-file")
        .arg(&pid_file)
        .arg("--bundle")
        .arg(&bundle)
        .arg("killed")
        .env("PROVM_RUNTIME_TRACES", &traces)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(run.stderr.take().unwrap()).lines();
    let said = stderr.find(|line| line.as_ref().is_ok_and(|line| line == "200 lines"));
    assert!(said.is_some(), "the container never said 200 lines");
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    // SAFETY: kill(2) on the container's process, which `run` has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(stderr);
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 9));
    let trace = traces.join("killed.provm");
    assert_recovered_after_a_kill(&trace);
}

/// `podman run -i` streams a pipe to the command as it runs: `head -n 2`
/// ends after the two lines written, though the pipe stays open, and the
/// container's trace replays.
#[test]
fn podman_run_i_streams_a_pipe_left_open() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let (child, cidfile) = podman.start(&["-i", "--rm", IMAGE, "head", "-n", "2"]);
    let output = fed_while_it_runs(child, b"first\nsecond\n");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "first\nsecond\n");
    assert_replay_matches(&podman.trace(&podman.id(&cidfile)));
}

/// `podman run -it`: the command's streams are a terminal in the guest,
/// of the size of podman's, which it follows; what is typed at podman's
/// streams to it as it runs (a line, echoed by the guest's terminal).
#[test]
fn podman_run_it_streams_the_terminal() {
    let _guest = one_guest_at_a_time();
    let podman = podman();
    let args = ["-it", "--rm", IMAGE, "sh", "-c", ON_A_TERMINAL_SIZED];
    let (command, cidfile) = podman.run_command(&args);
    let (status, output) = resized_then_typed(OnATerminal::spawn(command, 24, 80));
    assert_eq!(status, Some(0), "{output}");
    assert_replay_matches(&podman.trace(&podman.id(&cidfile)));
}
