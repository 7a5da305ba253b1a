//! provm-runtime's refusals, in runc's form (a message on standard error
//! and a JSON line in the `--log` file, exit status 1), and the lifecycle
//! up to the VM: no guest boots here. `create` checks that the guest
//! kernel is built (`provm kernel build`), as the end-to-end tests need.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Runtime {
    dir: tempfile::TempDir,
}

impl Runtime {
    fn new() -> Runtime {
        Runtime {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log.json")
    }

    /// Runs the runtime with `args`. Its output goes through files, not
    /// pipes: the container's process that `create` starts keeps
    /// `create`'s standard streams (they are the container's), and would
    /// hold a pipe open until it ends.
    fn run(&self, args: &[&str]) -> Output {
        let state = self.dir.path().join("state");
        self.run_with(&["--root", path(&state)], args)
    }

    /// Runs the runtime with the global options `globals`, then `args`.
    fn run_with(&self, globals: &[&str], args: &[&str]) -> Output {
        let streams = tempfile::tempdir_in(self.dir.path()).unwrap();
        let (out, err) = (streams.path().join("out"), streams.path().join("err"));
        let status = Command::new(env!("CARGO_BIN_EXE_provm-runtime"))
            .args(globals)
            .arg("--log")
            .arg(self.log())
            .arg("--log-format=json")
            .args(args)
            .env("PROVM_RUNTIME_TRACES", self.dir.path().join("traces"))
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .status()
            .unwrap();
        Output {
            status,
            stdout: std::fs::read(out).unwrap(),
            stderr: std::fs::read(err).unwrap(),
        }
    }

    /// Runs `args`, which must fail as runc fails, with `expected` in
    /// the message on standard error and in the log's last line.
    fn refused(&self, args: &[&str], expected: &str) {
        let output = self.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        let log = std::fs::read_to_string(self.log()).unwrap();
        let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
        assert_eq!(last["level"], "error");
        assert!(last["msg"].as_str().unwrap().contains(expected), "{last}");
        assert!(last["time"].is_string());
    }

    /// A bundle whose root holds one file (nothing runs it here).
    fn bundle(&self, version: &str) -> PathBuf {
        let bundle = self.dir.path().join(format!("bundle-{version}"));
        std::fs::create_dir_all(bundle.join("rootfs/etc")).unwrap();
        std::fs::write(bundle.join("rootfs/etc/marker"), b"runtime test\n").unwrap();
        let config = serde_json::json!({
            "ociVersion": version,
            "process": {"user": {"uid": 0, "gid": 0}, "args": ["true"], "cwd": "/"},
            "root": {"path": "rootfs"}
        });
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        bundle
    }

    fn status(&self, id: &str) -> String {
        let output = self.run(&["state", id]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let state: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        state["status"].as_str().unwrap().to_owned()
    }
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn bad_input_is_refused_in_runcs_form_with_nothing_written() {
    let runtime = Runtime::new();
    let missing = runtime.dir.path().join("no-bundle");
    runtime.refused(
        &["create", "--bundle", path(&missing), "c1"],
        "does not exist",
    );
    let v2 = runtime.bundle("2.0.0");
    runtime.refused(
        &["create", "--bundle", path(&v2), "c1"],
        "ociVersion is \"2.0.0\"",
    );
    runtime.refused(&["state", "nope"], "container nope does not exist");
    runtime.refused(&["start", "nope"], "container nope does not exist");
    runtime.refused(&["kill", "nope", "TERM"], "container nope does not exist");
    runtime.refused(&["delete", "nope"], "container nope does not exist");
    runtime.refused(&["exec", "c1", "sh"], "exec is not supported");
    runtime.refused(&["kill", "c1", "SIGNOPE"], "SIGNOPE");
    // No state was kept, no trace begun, nothing written to the bundles.
    let state = runtime.dir.path().join("state");
    assert!(!state.exists() || std::fs::read_dir(&state).unwrap().next().is_none());
    assert!(!runtime.dir.path().join("traces").exists());
    let names: Vec<_> = std::fs::read_dir(&v2)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn the_lifecycle_refuses_what_a_state_does_not_allow() {
    let runtime = Runtime::new();
    let bundle = runtime.bundle("1.0.2");
    let pid_file = runtime.dir.path().join("pid");
    let created = runtime.run(&[
        "create",
        "--bundle",
        path(&bundle),
        "--pid-file",
        path(&pid_file),
        "c1",
    ]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    assert_eq!(runtime.status("c1"), "created");
    let state: serde_json::Value =
        serde_json::from_slice(&runtime.run(&["state", "c1"]).stdout).unwrap();
    assert_eq!(state["pid"], pid);
    assert_eq!(state["id"], "c1");
    assert_eq!(
        state["rootfs"].as_str().unwrap(),
        path(&bundle.join("rootfs"))
    );
    runtime.refused(
        &["create", "--bundle", path(&bundle), "c1"],
        "container c1 exists already",
    );
    runtime.refused(&["delete", "c1"], "container c1 is created");
    let killed = runtime.run(&["kill", "c1", "KILL"]);
    assert!(
        killed.status.success(),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    // Reaped by whoever adopted it (`create` has exited); a zombie
    // counts as stopped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while runtime.status("c1") != "stopped" {
        assert!(Instant::now() < deadline, "c1 did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    runtime.refused(&["start", "c1"], "container c1 is stopped");
    runtime.refused(&["kill", "c1"], "container c1 is not running");
    let deleted = runtime.run(&["delete", "c1"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    runtime.refused(&["state", "c1"], "container c1 does not exist");
    assert!(runtime.run(&["delete", "--force", "c1"]).status.success());
}

#[test]
fn features_are_a_json_document() {
    let runtime = Runtime::new();
    let output = runtime.run(&["features"]);
    assert!(output.status.success());
    let features: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(features["ociVersionMin"], "1.0.0");
}

/// Slurm runs oci.conf's commands as they are written there: runc's form,
/// `--root=DIR` and the id before `--bundle` (or `-b`), as docs/runtime.md's
/// oci.conf and PLATFORM.md's for runc have them. Each is read: a refusal
/// is the runtime's (status 1, in runc's form), not the command line's
/// (status 2).
#[test]
fn slurms_oci_conf_command_lines_are_read() {
    let runtime = Runtime::new();
    let root = format!("--root={}", path(&runtime.dir.path().join("state")));
    let missing = runtime.dir.path().join("no-bundle");
    let id = "node1.alice.12.0.0";
    for (args, refusal) in [
        (vec!["state", id], Some("does not exist")),
        (vec!["kill", "--all", id], Some("does not exist")),
        (vec!["kill", "-a", id, "KILL"], Some("does not exist")),
        (vec!["delete", "--force", id], None),
        (
            vec!["run", id, "--bundle", path(&missing)],
            Some("does not exist"),
        ),
        (
            vec!["run", id, "-b", path(&missing)],
            Some("does not exist"),
        ),
    ] {
        let output = runtime.run_with(&[&root], &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        match refusal {
            Some(refusal) => {
                assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
                assert!(stderr.contains(refusal), "{args:?}: {stderr}");
            }
            None => assert!(output.status.success(), "{args:?}: {stderr}"),
        }
    }
}
