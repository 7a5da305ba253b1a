//! Disk images the end-to-end tests build for themselves: a busybox system
//! on ext4, as a bare-filesystem qcow2 and as a GPT-partitioned raw disk,
//! and the helpers the tests share. The end-to-end suite (tests/suite/) and
//! the benches each use part of it.
#![allow(dead_code)]

pub mod terminal;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use provm_engine::machine::Prepared;
use provm_engine::session::GuestSession;
use provm_engine::start::{Booted, Logging, RunOptions};
use provm_guest_agent::Job;

pub const MARKER: &str = "provm test image";

/// A job running `script` with the image's /bin/sh, on the test images'
/// root (the whole disk).
pub fn shell_job(options: &RunOptions, script: &str) -> Job {
    let options = RunOptions {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..options.clone()
    };
    provm_engine::start::job(&options, "/dev/vda").unwrap()
}

/// provm's own failures exit with this status (see src/cli/status.rs).
pub const PROVM_FAILED: i32 = 125;
/// `provm replay`'s status for a trace cut short that matched up to there.
pub const REPLAY_CUT_SHORT: i32 = 3;
/// A tool working on a replay (an analysis, the debugger, a fork) failed.
pub const TOOL_FAILED: i32 = 4;

/// The workloads every record/replay test and benchmark runs: (name, shell
/// script). Each touches one source of nondeterminism.
pub const RECORD_WORKLOADS: &[(&str, &str)] = &[
    ("shell pipeline", "seq 1 20000 | sort -r | head -n 5"),
    (
        "files written then read back",
        "dd if=/dev/zero of=/tmp/f bs=64k count=8 2>/dev/null; md5sum /tmp/f",
    ),
    ("/dev/urandom", "head -c 4096 /dev/urandom | md5sum"),
    ("time", "date +%s; sleep 1; date +%s"),
    (
        "fork/wait with pipes",
        "for i in $(seq 5); do echo $i | cat | wc -c; done",
    ),
    (
        "CPU-bound loop",
        "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo $i",
    ),
];

/// A pipeline, a file written and read back, entropy, the clock and
/// forks, without sleeps (which a pinned run skips and a plain one waits
/// out): the benches' shell workload.
pub const BENCH_WORKLOAD: &str = "seq 1 2000 | sort -r | head -n 3; \
    dd if=/dev/zero of=/tmp/f bs=64k count=8 2>/dev/null; md5sum /tmp/f; \
    head -c 4096 /dev/urandom | md5sum; date +%s; \
    for i in 1 2 3; do echo $i | cat | wc -c; done";

/// How a provm process ended.
pub struct Finished {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the provm binary.
pub fn provm(args: &[&str]) -> Finished {
    provm_with_env(args, &[])
}

pub fn provm_with_env(args: &[&str], env: &[(&str, &Path)]) -> Finished {
    let mut command = Command::new(env!("CARGO_BIN_EXE_provm"));
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.args(args).output().unwrap();
    Finished {
        status: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The event log digest provm printed on stderr (`run --pinned`, `record`,
/// a fork).
pub fn event_log_digest(finished: &Finished) -> &str {
    finished
        .stderr
        .lines()
        .find_map(|line| {
            line.strip_prefix("provm: event log sha256 ")
                .or_else(|| line.split("(event log sha256 ").nth(1))
                .map(|rest| rest.split(')').next().unwrap())
        })
        .unwrap_or_else(|| panic!("no event log digest in: {}", finished.stderr))
}

/// `provm record -o TRACE EXTRA... IMAGE -- /bin/sh -c SCRIPT`.
pub fn record_shell(image: &Path, trace: &Path, extra: &[&str], script: &str) -> Finished {
    let mut args = vec!["record", "-o", path(trace)];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[path(image), "--", "/bin/sh", "-c", script]);
    provm(&args)
}

/// A shell script that writes lines to the serial port for ever, every
/// byte a logged exit (100 lines: about 30,000 events, more than a chunk
/// of the log), and says "N lines" on stderr at every hundredth: a
/// recording to kill once it has written chunks.
pub const SERIAL_LINES_FOR_EVER: &str =
    "i=0; while :; do i=$((i+1)); echo \"line $i to the serial port\" >/dev/ttyS0; \
     [ $((i % 100)) = 0 ] && echo \"$i lines\" >&2; done";

/// `provm ARGS`, sent `signal` (SIGINT: Ctrl-C) once it has written a line
/// containing `line_part` to stderr, however long the host takes to get
/// there; a run that ends without writing one is not signalled.
pub fn provm_signalled_at(args: &[&str], signal: i32, line_part: &str) -> Finished {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reading_stdout = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).unwrap();
        text
    });
    let mut stderr = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains(line_part) && !stderr.contains(line_part) {
            // SAFETY: kill(2) on the child's PID, which it keeps until it
            // is waited for below.
            assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        }
        stderr.push_str(&line);
        stderr.push('\n');
    }
    let status = child.wait().unwrap();
    Finished {
        status: status.code().unwrap_or(-1),
        stdout: reading_stdout.join().unwrap(),
        stderr,
    }
}

/// `provm record` of `command` in the tiny image into `trace`, with
/// `options` and an exitless limit of 3 s, interrupted (SIGINT: Ctrl-C)
/// once its stderr says `warning`, the exitless warning or a part of it
/// (`--timeout 600` only as a backstop, should it never come).
pub fn record_until_warned(
    trace: &Path,
    options: &[&str],
    command: &[&str],
    warning: &str,
) -> Finished {
    let mut args = vec![
        "record",
        "-o",
        path(trace),
        "--exitless-limit",
        "3",
        "--timeout",
        "600",
    ];
    args.extend_from_slice(options);
    args.extend_from_slice(&[path(&images().tiny_qcow2), "--"]);
    args.extend_from_slice(command);
    provm_signalled_at(&args, libc::SIGINT, warning)
}

/// Runs `true` in `image`, which boots and snapshots it the first time, so
/// that a time limit set after falls on the command, and returns a
/// `--timeout` for a command that should be stopped by one: `floor`
/// seconds, or more where starting a command takes long (the SVM test bed
/// beside other work, whose whole machine is emulated): three times this
/// run's time, plus 5 s.
pub fn warm_then_time_limit(image: &Path, floor: u64) -> String {
    let started = Instant::now();
    let warm = provm(&["run", path(image), "--", "true"]);
    assert_eq!(warm.status, 0, "{}", warm.stderr);
    (3 * started.elapsed().as_secs() + 5).max(floor).to_string()
}

/// The guest `options` run in, on the image `prepared` checked, started
/// from the booted guest's snapshot with nothing observing it.
pub fn start_guest(options: &RunOptions, prepared: &Prepared) -> GuestSession {
    let deadline = Instant::now() + options.timeout;
    let booted = Booted::of(prepared, deadline).unwrap();
    provm_engine::start::start(
        options,
        prepared,
        booted.snapshot,
        deadline,
        Logging::Off,
        &mut [],
    )
    .unwrap()
    .session
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `provm replay --gdb` serving `trace` with a time-travel snapshot every
/// `snapshot_every` events, once it listens; its stderr is
/// collected by the thread returned.
pub fn serve_gdb(trace: &Path, address: &str, snapshot_every: u64) -> (Child, JoinHandle<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_provm"))
        .args(["replay", "--gdb", address, path(trace)])
        .args(["--snapshot-every", &snapshot_every.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let read = stderr.read_line(&mut line).unwrap();
        seen += &line;
        assert!(read > 0, "provm ended before listening: {seen}");
        if line.contains("waiting for gdb") {
            break;
        }
    }
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).unwrap();
        seen + &rest
    });
    (child, rest)
}

/// Runs Debian's gdb in batch mode on `vmlinux` against `provm replay
/// --gdb` at `address`, with `commands`; returns what it printed (stdout,
/// then stderr). gdb waits up to 10 minutes for a monitor command (the
/// README says why).
pub fn gdb_batch(vmlinux: &Path, address: &str, commands: &[&str]) -> String {
    let mut gdb = Command::new("gdb");
    gdb.args(["-batch", "-nx", "-ex", "set pagination off"])
        .args(["-ex", "set remotetimeout 600"])
        .args(["-ex", &format!("target remote {address}")]);
    for command in commands {
        gdb.args(["-ex", command]);
    }
    let output = gdb
        .arg(vmlinux)
        .output()
        .expect("gdb is needed: run scripts/install-deps");
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// The number of events in `trace`'s log, as `provm inspect` shows it.
pub fn log_events(trace: &Path) -> u64 {
    let inspect = provm(&["inspect", path(trace)]);
    inspect
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("events"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no event count in: {}", inspect.stdout))
}

/// The log positions of `trace`'s "agent output" events, in order: where
/// the command's output reached the host (the agent forwards it as it
/// comes), which marks where a workload's steps lie in the log.
pub fn agent_outputs(trace: &Path) -> Vec<u64> {
    let outputs = provm(&[
        "query",
        "--format",
        "csv",
        path(trace),
        "SELECT idx FROM events WHERE kind = 'agent output' ORDER BY idx",
    ]);
    assert_eq!(outputs.status, 0, "{}", outputs.stderr);
    outputs
        .stdout
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect()
}

/// Writes a copy of the trace `from` at `to`, each section's payload as
/// `change` returns it, given the section's kind and recorded payload.
pub fn rewrite_trace(
    from: &Path,
    to: &Path,
    mut change: impl FnMut(provm_trace::format::SectionKind, Vec<u8>) -> Vec<u8>,
) {
    let mut reader = provm_trace::format::TraceReader::open(from).unwrap();
    let mut writer = provm_trace::format::SectionWriter::create(to).unwrap();
    while let Some(section) = reader.next_section().unwrap() {
        let payload = change(section.kind, section.payload);
        writer.section(section.kind, &payload).unwrap();
    }
    writer.finish().unwrap();
}

/// Where a test keeps the trace it calls `name`.
pub fn trace_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{}.provm", name.replace(['/', ' '], "-")))
}

/// Replays `trace`, asserts it matched to its end, and returns what replay
/// printed.
pub fn assert_replay_matches(trace: &Path) -> String {
    let replay = provm(&["replay", path(trace)]);
    assert_eq!(
        replay.status,
        0,
        "{}: {}{}",
        trace.display(),
        replay.stdout,
        replay.stderr
    );
    assert!(
        replay.stdout.starts_with("replay matched: "),
        "{}",
        replay.stdout
    );
    replay.stdout
}

/// Replays `trace`, a recording cut short, asserts it matched up to where
/// it was cut (status 3), and returns what replay printed.
pub fn assert_replay_cut_short(trace: &Path) -> String {
    let replay = provm(&["replay", path(trace)]);
    assert_eq!(
        replay.status,
        REPLAY_CUT_SHORT,
        "{}: {}{}",
        trace.display(),
        replay.stdout,
        replay.stderr
    );
    assert!(
        replay
            .stdout
            .starts_with("replay matched up to where the recording was cut short"),
        "{}",
        replay.stdout
    );
    replay.stdout
}

/// The Debian 12 image with python3 that scripts/debian-image builds (once,
/// cached like the demo's).
pub fn debian_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| scripts_debian_image(&[]))
}

/// The same image with gcc and make (`--with build-essential`), cached in a
/// file of its own.
pub fn debian_build_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| scripts_debian_image(&["--with", "build-essential"]))
}

/// The same image with Debian's numpy (1.24), cached in a file of its own.
pub fn debian_numpy_image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| scripts_debian_image(&["--with", "python3-numpy"]))
}

/// Runs scripts/debian-image with `args`; returns the path it prints.
fn scripts_debian_image(args: &[&str]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/debian-image");
    let output = Command::new(&script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(
        output.status.success(),
        "scripts/debian-image {args:?} failed"
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim_end())
}

pub fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Guests run one at a time in a test process: on PVM each guest's vCPU
/// is kept on the first core the process may use (vmm/src/host_core.rs),
/// and two guests on one core slow each other more than twofold (a
/// workload took 84 s alone, 199 s each side by side). A second test
/// process on another core does not (scripts/test runs one there).
pub fn one_guest_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The scratch directory (traces, overlays) of the test module `module`
/// (pass `module_path!()`): a folder of its own in this process's, since
/// every module of the test binary runs in the one process.
pub fn scratch(module: &str) -> PathBuf {
    let dir = images().dir.join(module.replace("::", "."));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub struct Images {
    _dir: tempfile::TempDir,
    /// This test process's own scratch directory (see `scratch`).
    dir: PathBuf,
    /// The busybox root the images hold (shared: read it only).
    pub root: PathBuf,
    /// A bare ext4 file system as qcow2 (shared: the tests never write it,
    /// as provm never writes an image).
    pub tiny_qcow2: PathBuf,
    /// A GPT disk whose second partition holds the ext4 file system.
    pub partitioned_raw: PathBuf,
}

pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let built = shared_images();
        Images {
            dir: dir.path().to_owned(),
            _dir: dir,
            root: built.join("root"),
            tiny_qcow2: built.join("tiny.qcow2"),
            partitioned_raw: built.join("partitioned.raw"),
        }
    })
}

/// Where the test images are, built once for every test process and
/// benchmark (the images are the same bytes whenever their inputs are, so
/// they are kept under a digest of those inputs in cargo's target/tmp).
/// Building them takes seconds natively and about 20 s on the SVM test bed,
/// where every test is a process of its own and target/ is read-only: there
/// the host's copy is used, or, without one, a copy of the process's own.
fn shared_images() -> PathBuf {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-images");
    let built = cache.join(image_inputs_digest());
    if built.join(BUILT_MARK).exists() {
        return built;
    }
    let staging = match std::fs::create_dir_all(&cache).and_then(|()| tempfile::tempdir_in(&cache))
    {
        Ok(staging) => staging,
        // A read-only target/ (the test bed): this process's own copy.
        Err(_) => {
            let own = tempfile::tempdir().unwrap().keep();
            build_images(&own);
            return own;
        }
    };
    build_images(staging.path());
    std::fs::write(staging.path().join(BUILT_MARK), "").unwrap();
    // Another process may have put its copy in place first: the same bytes.
    let _ = std::fs::rename(staging.keep(), &built);
    built
}

/// Written last into a built image directory: the build finished.
const BUILT_MARK: &str = "built";

/// What the test images are made of: the build recipe (this file), busybox,
/// the test programs' sources and the compiler that builds them.
fn image_inputs_digest() -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(include_bytes!("mod.rs"));
    hasher.update(
        std::fs::read("/bin/busybox").expect("busybox-static is needed: run scripts/install-deps"),
    );
    for program in TEST_PROGRAMS {
        hasher.update(std::fs::read(test_program_source(program)).unwrap());
    }
    for header in TEST_PROGRAM_HEADERS {
        hasher.update(std::fs::read(test_data(header)).unwrap());
    }
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .expect("gcc is needed");
    hasher.update(gcc.stdout);
    hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e} (run scripts/install-deps)"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One fixed identity for every file system and partition table the tests
/// build: with it, fixed timestamps and the same content, every test binary
/// builds byte-identical images, so the booted guest's snapshot (whose cache
/// key includes the image's digest) is shared by all of them and the guest
/// cold-boots once per machine configuration instead of once per binary.
const FIXED_UUID: &str = "6a0e5e4b-7b1e-4c6e-9d3a-70726f766d31";
/// The time every inode and the superblock carry (seconds since 1970).
const FIXED_TIME: &str = "1";

/// Builds the test images into `path`.
pub fn build_images(path: &Path) {
    let root = path.join("root");
    populate_busybox_root(&root);

    let raw = path.join("tiny.raw");
    deterministic_ext4(&root, &raw, "24M");
    let tiny_qcow2 = path.join("tiny.qcow2");
    run(Command::new("qemu-img")
        .args(["convert", "-O", "qcow2"])
        .arg(&raw)
        .arg(&tiny_qcow2));

    // GPT: a small first partition (no file system), then the root at 2 MiB.
    let partitioned_raw = path.join("partitioned.raw");
    std::fs::File::create(&partitioned_raw)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let table = format!(
        "label: gpt\nlabel-id: {FIXED_UUID}\n\
         start=2048, size=2048, type=L, uuid={}\n\
         start=4096, size=55296, type=L, uuid={}\n",
        with_last_digit(FIXED_UUID, '2'),
        with_last_digit(FIXED_UUID, '3'),
    );
    let mut sfdisk = Command::new("sfdisk");
    sfdisk
        .arg("--quiet")
        .arg(&partitioned_raw)
        .stdin(std::process::Stdio::piped());
    let mut child = sfdisk
        .spawn()
        .expect("sfdisk (package fdisk) is needed: run scripts/install-deps");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), table.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk failed");
    let root_partition = path.join("partition.raw");
    deterministic_ext4(&root, &root_partition, "27M");
    copy_into(&root_partition, &partitioned_raw, 4096 * 512);
    std::fs::remove_file(&root_partition).unwrap();
}

fn with_last_digit(uuid: &str, digit: char) -> String {
    format!("{}{digit}", &uuid[..uuid.len() - 1])
}

/// An ext4 file system of `size` holding `root`, the same bytes whenever
/// `root` has the same content: a fixed UUID and directory hash seed, and
/// every time (the superblock's through E2FSPROGS_FAKE_TIME, each inode's
/// by debugfs: mkfs -d copies ctime, which no tool can set on the source).
fn deterministic_ext4(root: &Path, image: &Path, size: &str) {
    run(Command::new("mkfs.ext4")
        .env("E2FSPROGS_FAKE_TIME", FIXED_TIME)
        .args(["-q", "-U", FIXED_UUID, "-E"])
        .arg(format!("hash_seed={FIXED_UUID}"))
        .arg("-d")
        .arg(root)
        .arg(image)
        .arg(size));
    let mut commands = String::new();
    for inode in inodes_under(root) {
        for field in ["atime", "mtime", "ctime", "crtime"] {
            commands += &format!("set_inode_field \"{inode}\" {field} {FIXED_TIME}\n");
        }
    }
    let script = image.with_extension("debugfs");
    std::fs::write(&script, commands).unwrap();
    run(Command::new("debugfs")
        .env("E2FSPROGS_FAKE_TIME", FIXED_TIME)
        .arg("-w")
        .arg("-f")
        .arg(&script)
        .arg(image));
    std::fs::remove_file(&script).unwrap();
}

/// Every path under `root` as the file system it becomes names it
/// ("/", "/bin", "/bin/sh", ...), symbolic links not followed.
fn inodes_under(root: &Path) -> Vec<String> {
    let mut found = vec!["/".to_owned()];
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let inside = entry.path().strip_prefix(root).unwrap().to_owned();
            found.push(format!("/{}", inside.display()));
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            }
        }
    }
    found
}

/// Writes `part` into `disk` at byte `offset`.
fn copy_into(part: &Path, disk: &Path, offset: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let bytes = std::fs::read(part).unwrap();
    let mut disk = std::fs::OpenOptions::new().write(true).open(disk).unwrap();
    disk.seek(SeekFrom::Start(offset)).unwrap();
    disk.write_all(&bytes).unwrap();
}

/// A test program as built for the test images (static), runnable on the
/// host too.
pub fn test_program(name: &str) -> PathBuf {
    images().root.join("bin").join(name)
}

/// The C programs the test images carry in /bin, from tests/data/NAME.c.
const TEST_PROGRAMS: [&str; 14] = [
    "vector_copy",
    "ymm_hold",
    "ymm_signal",
    "host_tsc",
    "tsc_kept",
    "sysv_shm",
    "tcp_echo",
    "timed_loop",
    "alarm_progress",
    "disk_write",
    "free_large",
    "race_counter",
    "spin_flag",
    "two_counters",
];

/// The headers of tests/data that the programs include.
const TEST_PROGRAM_HEADERS: [&str; 1] = ["avx_runs.h"];

/// A file of tests/data.
pub fn test_data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

fn test_program_source(program: &str) -> PathBuf {
    test_data(&format!("{program}.c"))
}

fn populate_busybox_root(root: &Path) {
    for dir in ["bin", "etc", "tmp", "proc", "sys", "dev", "data", "root"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .expect("busybox-static is needed: run scripts/install-deps");
    let list = Command::new("/bin/busybox").arg("--list").output().unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
    }
    std::fs::write(root.join("etc/marker"), format!("{MARKER}\n")).unwrap();
    for program in TEST_PROGRAMS {
        run(Command::new("gcc")
            .args(["-O2", "-static", "-o"])
            .arg(root.join("bin").join(program))
            .arg(test_program_source(program)));
    }
    std::fs::write(root.join("data/in.txt"), "pear\napple\nfig\n").unwrap();
}

/// SHA-256 of a file, to show it was not modified.
pub fn digest(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Least-squares slope of y over x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    covariance / variance
}

/// An HTTP server on the host's 127.0.0.1 that answers every request with
/// the same bytes, one connection at a time (the network tests' and
/// bench's): the guest reaches it as 10.0.2.2 with `--net`.
pub struct FileServer {
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FileServer {
    pub fn serving(body: Vec<u8>) -> FileServer {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                // The request, up to its blank line; its path is not read.
                let mut request = Vec::new();
                let mut byte = [0u8];
                while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    request.push(byte[0]);
                }
                let header = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
                    body.len()
                );
                let _ = stream
                    .write_all(header.as_bytes())
                    .and_then(|()| stream.write_all(&body));
            }
        });
        FileServer {
            port,
            stop,
            thread: Some(thread),
        }
    }

    /// The URL the guest fetches the bytes from.
    pub fn guest_url(&self) -> String {
        format!("http://10.0.2.2:{}/file", self.port)
    }

    /// Stops serving: nothing listens on the port any more.
    pub fn stop(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wakes the accept loop, which then sees the flag.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        self.thread.take().unwrap().join().unwrap();
    }
}

/// `len` bytes that do not compress (a download's size is its size in
/// the trace too), the same every time.
pub fn incompressible(len: usize) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut bytes = Vec::with_capacity(len + 32);
    let mut block = Sha256::digest(b"provm network test").to_vec();
    while bytes.len() < len {
        block = Sha256::digest(&block).to_vec();
        bytes.extend_from_slice(&block);
    }
    bytes.truncate(len);
    bytes
}

/// The container image the tests build: busybox in three layers, the
/// second whiting out /etc/gone, making /opt opaque (its own /opt/new
/// stays) and hard-linking /etc/hard to /etc/keep, with a device node,
/// an owner and an xattr in the first; its configuration gives Env,
/// WorkingDir, User (a name in its /etc/passwd) and Cmd. As an OCI layout, and as skopeo's docker-archive of
/// it. The same bytes in every test process, so it is made into the same
/// disk, and its booted guest is cached once.
pub struct ContainerImage {
    /// `oci:DIR:TAG`.
    pub oci: String,
    /// `docker-archive:FILE:NAME:TAG`.
    pub docker_archive: String,
    /// That FILE, as `docker save` writes one.
    pub archive: PathBuf,
    /// The layout's directory.
    pub layout: PathBuf,
}

/// What the container image's Cmd prints.
pub const CONTAINER_CMD_OUTPUT: &str = "hello from /work as 1000:100\n";

pub fn container_image() -> &'static ContainerImage {
    static IMAGE: OnceLock<ContainerImage> = OnceLock::new();
    IMAGE.get_or_init(|| {
        use oci_spec::image::{Arch, ConfigBuilder};
        let dir = images().dir.join("container-image");
        let layout = dir.join("layout");
        let config = ConfigBuilder::default()
            .env(vec!["PATH=/bin".to_owned(), "GREETING=hello".to_owned()])
            .working_dir("/work".to_owned())
            .user("app".to_owned())
            .cmd(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                "echo $GREETING from $(pwd) as $(id -u):$(id -g)".to_owned(),
            ])
            .build()
            .unwrap();
        provm_engine::image::layout::Layout::new(Arch::Amd64, config, container_layers(), "test")
            .unwrap()
            .write_dir(&layout)
            .unwrap();
        let archive = dir.join("docker.tar");
        run(Command::new("skopeo")
            .arg("copy")
            .arg(format!("oci:{}:test", layout.display()))
            .arg(format!("docker-archive:{}:provm/test:1", archive.display())));
        ContainerImage {
            oci: format!("oci:{}:test", layout.display()),
            docker_archive: format!("docker-archive:{}:provm/test:1", archive.display()),
            archive,
            layout,
        }
    })
}

fn container_layers() -> Vec<Vec<u8>> {
    use provm_engine::image::layout::{Attributes, LayerWriter};
    let written = |write: &dyn Fn(&mut LayerWriter) -> std::io::Result<()>| {
        let mut layer = LayerWriter::new(1);
        write(&mut layer).unwrap();
        layer.finish().unwrap()
    };
    let base = written(&|l| {
        l.directory("bin", 0o755)?;
        l.file("bin/busybox", 0o755, &std::fs::read("/bin/busybox")?)?;
        let list = Command::new("/bin/busybox").arg("--list").output()?;
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" {
                l.symlink(&format!("bin/{applet}"), "busybox")?;
            }
        }
        l.directory("tmp", 0o1777)?;
        l.directory("etc", 0o755)?;
        l.file("etc/keep", 0o644, b"keep\n")?;
        l.file(
            "etc/passwd",
            0o644,
            b"root:x:0:0::/root:/bin/sh\napp:x:1000:100::/work:/bin/sh\n",
        )?;
        l.file("etc/group", 0o644, b"root:x:0:\nusers:x:100:\n")?;
        l.file("etc/gone", 0o644, b"gone\n")?;
        let owned = Attributes {
            uid: 1000,
            gid: 100,
            xattrs: &[("user.provm", b"yes")],
        };
        l.file_with("etc/owned", 0o600, &owned, b"owned\n")?;
        l.directory("opt", 0o755)?;
        l.file("opt/old", 0o644, b"old\n")?;
        l.file("opt/old-dir/inside", 0o644, b"old\n")?;
        l.char_device("srv/null", 0o666, 1, 3)
    });
    let middle = written(&|l| {
        l.whiteout("etc/gone")?;
        l.file("opt/new", 0o644, b"new\n")?;
        l.opaque("opt")?;
        l.hard_link("etc/hard", "etc/keep")
    });
    let top = written(&|l| l.file("work/hello", 0o644, b"hello\n"));
    vec![base, middle, top]
}

/// Stops a daemon a test started: SIGTERM, then SIGKILL if it is still
/// there `grace` later.
pub fn stop_daemon(daemon: &mut Child, grace: Duration) {
    // SAFETY: kill(2) on our child's PID, which it keeps until waited for.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while daemon.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// `command` started with its standard streams piped.
pub fn spawn_piped(command: &mut Command) -> Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A command that says whether its streams are a terminal, and which,
/// then when it is ready for a line, and its terminal's size once it has
/// the line: for a test that resizes the terminal, then types (see
/// `resized_then_typed`).
pub const ON_A_TERMINAL_SIZED: &str = "test -t 0 && test -t 1 && echo \"a terminal: $(tty)\"; \
     echo \"ready at $(stty size)\"; read line; echo \"now $(stty size)\"; echo \"got $line\"";

/// `ON_A_TERMINAL_SIZED` on `terminal`, 24 by 80 when it started: resized
/// to 50 by 132 once it is ready, then typed at `typed`. Its exit status
/// and output, which must show that its streams were the guest's own
/// terminal (whose line discipline ends lines with CR LF; a client's
/// terminal that is not raw may add a CR of its own) and that it took
/// both sizes.
pub fn resized_then_typed(mut terminal: terminal::OnATerminal) -> (Option<i32>, String) {
    terminal.wait_for("ready at");
    terminal.resize(50, 132);
    // The new size reaches the guest at its next exit, long before this.
    std::thread::sleep(Duration::from_secs(1));
    terminal.type_in(b"typed\n");
    let (status, output) = terminal.finish();
    for line in [
        "a terminal: /dev/pts/0\r",
        "ready at 24 80\r",
        "now 50 132\r",
        "got typed\r",
    ] {
        assert!(output.contains(line), "no {line:?} in: {output}");
    }
    (status, output)
}

/// `child`'s output, once it has ended, with `input` written to its
/// standard input, which stays open until then.
pub fn fed_while_it_runs(mut child: Child, input: &[u8]) -> Output {
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the command still waits with its input open");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    drop(stdin);
    output
}
