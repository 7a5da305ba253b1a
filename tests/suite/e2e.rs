//! End-to-end tests: the real guest kernel on provm's own VMM, on disk images
//! the tests build. Boots are few and serialized (see common::one_guest_at_a_time).

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    digest, images, one_guest_at_a_time, path, provm, provm_with_env, shell_job, MARKER,
    PROVM_FAILED,
};
use provm_engine::session::{GuestError, GuestSession, SessionError};
use provm_engine::start::RunOptions;
use provm_guest_agent::Outcome;

fn options(image: &Path) -> RunOptions {
    RunOptions {
        timeout: Duration::from_secs(600),
        ..RunOptions::new(image.to_owned(), Vec::new())
    }
}

/// Runs one shell command in the shared guest.
fn sh(
    session: &mut GuestSession,
    options: &RunOptions,
    script: &str,
) -> Result<(Outcome, String, String), SessionError> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let outcome = session.run(shell_job(options, script), &mut stdout, &mut stderr)?;
    Ok((
        outcome,
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    ))
}

#[test]
fn one_guest_runs_many_commands_and_never_writes_the_image() {
    let _guest = one_guest_at_a_time();
    let images = images();
    let image_digest = digest(&images.tiny_qcow2);
    let overlay = common::scratch(module_path!()).join("kept-overlay.qcow2");
    let options = RunOptions {
        keep_overlay: Some(overlay.clone()),
        ..options(&images.tiny_qcow2)
    };
    let prepared = provm_engine::start::prepare(&options).unwrap();
    let mut guest = common::start_guest(&options, &prepared);

    let (outcome, stdout, stderr) = sh(&mut guest, &options, "echo hi; exit 3").unwrap();
    assert_eq!(
        (outcome, stdout.as_str(), stderr.as_str()),
        (Outcome::Exited(3), "hi\n", "")
    );

    let (outcome, stdout, stderr) = sh(
        &mut guest,
        &options,
        "echo out; echo err >&2; cat /etc/marker",
    )
    .unwrap();
    assert_eq!(outcome, Outcome::Exited(0));
    assert_eq!(stdout, format!("out\n{MARKER}\n"));
    assert_eq!(stderr, "err\n");

    let (_, stdout, _) = sh(
        &mut guest,
        &options,
        "sort /data/in.txt | head -n 2 | tr a-z A-Z",
    )
    .unwrap();
    assert_eq!(stdout, "APPLE\nFIG\n");

    let (outcome, _, _) = sh(&mut guest, &options, "exec /no/such/program").unwrap();
    assert_eq!(outcome.shell_status(), 127);
    let not_found = provm_engine::start::job(
        &RunOptions {
            command: vec!["no-such-program".into()],
            ..options.clone()
        },
        "/dev/vda",
    )
    .unwrap();
    assert_eq!(
        guest
            .run(not_found, &mut Vec::new(), &mut Vec::new())
            .unwrap(),
        Outcome::NotFound
    );

    let (outcome, _, _) = sh(&mut guest, &options, "kill -SEGV $$").unwrap();
    assert_eq!(
        (outcome, outcome.shell_status()),
        (Outcome::Signaled(11), 139)
    );

    // Processes keep their own vector registers while another one runs.
    let (outcome, stdout, _) = sh(
        &mut guest,
        &options,
        "yes > /dev/null & vector_copy; status=$?; kill $!; exit $status",
    )
    .unwrap();
    assert_eq!(
        (outcome, stdout.as_str()),
        (Outcome::Exited(0), "corrupted copies: 0 of 120\n")
    );

    let in_tmp = RunOptions {
        cwd: "/tmp".into(),
        env: vec!["GREETING=hello there".into()],
        ..options.clone()
    };
    let (_, stdout, _) = sh(&mut guest, &in_tmp, "pwd; echo \"$GREETING\"; echo $PATH").unwrap();
    assert_eq!(
        stdout,
        "/tmp\nhello there\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    );

    let missing_cwd = RunOptions {
        cwd: "/no/such/dir".into(),
        ..options.clone()
    };
    match sh(&mut guest, &missing_cwd, "true") {
        Err(SessionError::Guest {
            error: GuestError::AgentFailed(reason),
            ..
        }) => assert!(reason.contains("/no/such/dir"), "{reason}"),
        other => panic!("a missing working directory must be reported, got {other:?}"),
    }

    let (outcome, stdout, _) = sh(
        &mut guest,
        &options,
        "echo written in the guest > /data/written.txt && cat /data/written.txt",
    )
    .unwrap();
    assert_eq!(
        (outcome, stdout.as_str()),
        (Outcome::Exited(0), "written in the guest\n")
    );
    guest.power_off().unwrap();

    assert_eq!(
        digest(&images.tiny_qcow2),
        image_digest,
        "the user's image was modified"
    );
    // The kept overlay holds the guest's write: boot it as an image.
    let rerun = provm(&[
        "run",
        path(&overlay),
        "--",
        "sh",
        "-c",
        "cat /data/written.txt; exit 7",
    ]);
    assert_eq!(rerun.stdout, "written in the guest\n", "{}", rerun.stderr);
    assert_eq!(rerun.status, 7);
    assert_eq!(digest(&images.tiny_qcow2), image_digest);
}

/// `-v` shows the console but boots the same machine: the kernel command
/// line, which keys the booted snapshot, does not name the log level, so a
/// verbose run starts from the snapshot a quiet one cached.
#[test]
fn a_verbose_run_boots_the_machine_a_quiet_run_does() {
    let _guest = one_guest_at_a_time();
    let image = path(&images().tiny_qcow2);
    let quiet = provm(&["run", image, "--", "cat", "/proc/cmdline"]);
    let verbose = provm(&["-v", "run", image, "--", "cat", "/proc/cmdline"]);
    assert_eq!(quiet.status, 0, "{}", quiet.stderr);
    assert_eq!(verbose.status, 0, "{}", verbose.stderr);
    assert!(quiet.stdout.contains("rdinit=/init"), "{}", quiet.stdout);
    assert_eq!(quiet.stdout, verbose.stdout);
    assert!(
        !verbose.stderr.contains("booting the guest"),
        "{}",
        verbose.stderr
    );
}

/// The shared images (built by this process or an earlier one) and a copy
/// built now, over a second later so that file times would differ, are the
/// same bytes: so the shared copy may be kept under a digest of the inputs
/// alone, and every test binary shares one booted guest's snapshot (the
/// cache is keyed by the image). One build, not two: the test beds run
/// this test to build the shared copy before their guests start.
#[test]
fn test_images_are_the_same_bytes_whenever_they_are_built() {
    let shared = images();
    std::thread::sleep(Duration::from_millis(1100));
    let now = tempfile::tempdir().unwrap();
    common::build_images(now.path());
    for (image, built) in [
        ("tiny.qcow2", &shared.tiny_qcow2),
        ("partitioned.raw", &shared.partitioned_raw),
    ] {
        assert_eq!(digest(&now.path().join(image)), digest(built), "{image}");
    }
}

#[test]
fn a_partitioned_image_boots_from_its_root_partition() {
    let _guest = one_guest_at_a_time();
    let image = &images().partitioned_raw;
    let before = digest(image);
    let run = provm(&["run", path(image), "--", "cat", "/etc/marker"]);
    assert_eq!(
        (run.status, run.stdout.as_str()),
        (0, format!("{MARKER}\n").as_str()),
        "{}",
        run.stderr
    );
    assert_eq!(digest(image), before);
}

/// The agent mounts the root read-only at boot, before the snapshot, only
/// if that writes nothing: an ext4 whose journal needs replaying (as a
/// crash leaves it) would be written even read-only, and the boot's writes
/// are lost under the snapshot. Such a root is mounted by the first
/// command, and the command runs.
#[test]
fn a_root_whose_journal_needs_replaying_is_mounted_by_the_first_command() {
    let _guest = one_guest_at_a_time();
    let image = common::scratch(module_path!()).join("needs-recovery.raw");
    let tools = [
        Command::new("qemu-img")
            .args([
                "convert",
                "-O",
                "raw",
                path(&images().tiny_qcow2),
                path(&image),
            ])
            .status(),
        Command::new("debugfs")
            .args(["-w", "-R", "feature needs_recovery", path(&image)])
            .status(),
    ];
    for status in tools {
        assert!(status.unwrap().success());
    }
    let run = provm(&[
        "run",
        "-v",
        path(&image),
        "--",
        "sh",
        "-c",
        "touch /written && echo ok",
    ]);
    assert_eq!(
        (run.status, run.stdout.as_str()),
        (0, "ok\n"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("/dev/vda is left for the job to mount: its journal needs replaying"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_guest_past_its_timeout_is_stopped_with_its_console() {
    let _guest = one_guest_at_a_time();
    // Long enough for the agent to mount the root and start the loop.
    let limit = common::warm_then_time_limit(&images().tiny_qcow2, 8);
    let run = provm(&[
        "run",
        "--timeout",
        &limit,
        path(&images().tiny_qcow2),
        "--",
        "sh",
        "-c",
        "while :; do :; done",
    ]);
    assert_eq!(run.status, PROVM_FAILED);
    assert!(
        run.stderr.contains("did not finish within the time limit"),
        "{}",
        run.stderr
    );
    // The report names the spinning shell, read from the guest kernel.
    assert!(
        run.stderr.contains("the task on the CPU: pid ") && run.stderr.contains("`sh`"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("last lines of the guest console"),
        "{}",
        run.stderr
    );
}

/// Bad input is refused before any guest boots, with the problem and the fix.
#[test]
fn bad_input_gets_a_clear_error() {
    let images = images();
    let tiny = path(&images.tiny_qcow2);
    let dir = &common::scratch(module_path!());
    let expect_error = |args: &[&str], needle: &str| {
        let run = provm(args);
        assert_eq!(run.status, PROVM_FAILED, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(needle),
            "{args:?}: expected {needle:?} in {}",
            run.stderr
        );
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    };

    expect_error(
        &["run", "/no/such/image.qcow2", "--", "true"],
        "/no/such/image.qcow2",
    );

    // An unknown CPU model is a usage error that lists the models.
    let unknown_cpu = provm(&["record", "--cpu", "x86-64-v9", tiny, "--", "true"]);
    assert_eq!(unknown_cpu.status, 2, "{}", unknown_cpu.stderr);
    assert!(
        unknown_cpu
            .stderr
            .contains("[possible values: host, x86-64-v2, x86-64-v3]"),
        "{}",
        unknown_cpu.stderr
    );

    // A quantum of 0 ms would preempt at every kick: a usage error.
    let no_quantum = provm(&["record", "--preempt", "0", tiny, "--", "true"]);
    assert_eq!(no_quantum.status, 2, "{}", no_quantum.stderr);
    assert!(
        no_quantum.stderr.contains("--preempt <MS>")
            && no_quantum.stderr.contains("0 is not in 1.."),
        "{}",
        no_quantum.stderr
    );

    let empty = dir.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    expect_error(&["run", path(&empty), "--", "true"], "empty");

    // A qcow2 cut short, as an interrupted copy leaves it: its tables are gone.
    let corrupt = dir.join("corrupt.qcow2");
    let bytes = std::fs::read(&images.tiny_qcow2).unwrap();
    std::fs::write(&corrupt, &bytes[..4096]).unwrap();
    expect_error(&["run", path(&corrupt), "--", "true"], "corrupt qcow2");

    let blank = dir.join("blank.raw");
    std::fs::File::create(&blank)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    expect_error(
        &["run", path(&blank), "--", "true"],
        "neither a partition table nor an ext2/3/4 filesystem",
    );

    expect_error(&["run", "--root", "9", tiny, "--", "true"], "9");
    expect_error(
        &["run", "--env", "NOEQUALS", tiny, "--", "true"],
        "KEY=VALUE",
    );
    expect_error(
        &["run", "--kernel", "/no/such/vmlinux", tiny, "--", "true"],
        "/no/such/vmlinux",
    );
    expect_error(
        &["run", "--kernel", "/etc/hostname", tiny, "--", "true"],
        "vmlinux",
    );
    expect_error(&["run", "--memory", "8", tiny, "--", "true"], "too small");

    // An existing output is the user's: refused before any work, unchanged.
    let existing = dir.join("existing.provm");
    std::fs::write(&existing, b"keep me").unwrap();
    let refusal = "exists; pass --force";
    expect_error(
        &["record", "-o", path(&existing), tiny, "--", "true"],
        refusal,
    );
    expect_error(
        &["run", "--prov", path(&existing), tiny, "--", "true"],
        refusal,
    );
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");

    // A machine where the kernel was never built: each command says what
    // to run, the SMP kernel's for a guest of more than one vCPU.
    let empty_cache = dir.join("empty-cache");
    let single =
        "has not been built yet; build it (a few minutes, once) with: provm kernel build\n";
    let smp = "for more than one vCPU (--cpus N) has not been built yet; build it (a few minutes, once) with: provm kernel build --smp\n";
    for (args, told) in [
        (&["kernel", "path"][..], single),
        (&["run", tiny, "--", "true"], single),
        (&["run", "--cpus", "2", tiny, "--", "true"], smp),
    ] {
        let run = provm_with_env(args, &[("PROVM_CACHE", &empty_cache)]);
        assert_eq!(run.status, PROVM_FAILED, "{}", run.stderr);
        assert!(run.stderr.contains(told), "{}", run.stderr);
    }
}

/// Without /dev/kvm, or without the right to open it, provm says how to fix it.
/// Needs root to make a private mount namespace and to switch users.
#[test]
fn missing_or_forbidden_kvm_is_explained() {
    // It drops to another user and hides /dev: only root can set that up.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (as CI has): run the tests as root"
    );
    let tiny = path(&images().tiny_qcow2);
    let provm = env!("CARGO_BIN_EXE_provm");
    let no_kvm = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs none /dev && exec \"$0\" \"$@\"",
        ])
        .args([provm, "run", tiny, "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&no_kvm.stderr);
    assert_eq!(no_kvm.status.code(), Some(PROVM_FAILED), "{stderr}");
    assert!(stderr.contains("/dev/kvm does not exist"), "{stderr}");

    let forbidden = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            provm,
            "run",
            tiny,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&forbidden.stderr);
    assert_eq!(forbidden.status.code(), Some(PROVM_FAILED), "{stderr}");
    assert!(
        stderr.contains("no permission to open /dev/kvm"),
        "{stderr}"
    );
}
