//! Hypervisor blame end to end, on the real guest through the provm binary:
//! a recording keeps its exit timing and `provm blame` shows it per guest
//! process (text, CSV, JSON, SVG); an injected per-exit delay moves the
//! blame of its device, and only its device, by delay x exits; a what-if
//! replay's measured times match their predictions; bad input is refused.
//! The workload writes to the disk with O_DIRECT, so that each 4 KiB block
//! is a virtio-blk request.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{images, one_guest_at_a_time, path, provm, record_shell, PROVM_FAILED};
use provm_engine::timing::report::DeviceTiming;
use provm_engine::timing::TimingReport;

const DISK_WORKLOAD: &str = "dd if=/dev/zero of=/data/f bs=4k count=128 oflag=direct";
const DISK: &str = "virtio-blk";

fn in_dir(name: &str) -> PathBuf {
    common::scratch(module_path!()).join(name)
}

/// The workload, recorded once for the tests that read a trace.
fn recorded() -> &'static Path {
    static TRACE: OnceLock<PathBuf> = OnceLock::new();
    TRACE.get_or_init(|| {
        let trace = in_dir("disk.provm");
        let recorded = record_shell(&images().tiny_qcow2, &trace, &[], DISK_WORKLOAD);
        assert_eq!(recorded.status, 0, "{}", recorded.stderr);
        trace
    })
}

/// `provm run --timing` of the workload, with `extra` arguments.
fn timed_run(name: &str, extra: &[&str]) -> TimingReport {
    let timing = in_dir(&format!("{name}.json"));
    let mut args = vec!["run", "--timing", path(&timing)];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        path(&images().tiny_qcow2),
        "--",
        "/bin/sh",
        "-c",
        DISK_WORKLOAD,
    ]);
    let ran = provm(&args);
    assert_eq!(ran.status, 0, "{}", ran.stderr);
    TimingReport::from_json(&std::fs::read(&timing).unwrap()).unwrap()
}

fn device(report: &TimingReport, name: &str) -> DeviceTiming {
    report.by_device().remove(name).unwrap_or_default()
}

#[test]
fn a_recording_is_blamed_per_process_in_every_format() {
    let _guest = one_guest_at_a_time();
    let trace = recorded();
    let text = provm(&["blame", path(trace)]);
    assert_eq!(text.status, 0, "{}", text.stderr);
    let dd_row = text
        .stdout
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some("dd"))
        .unwrap_or_else(|| panic!("no row for dd:\n{}", text.stdout));
    assert!(
        dd_row
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<i32>()
            .unwrap()
            > 1
    );
    assert!(
        text.stdout.contains("measured on the host clock"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("estimated:"), "{}", text.stdout);

    let json = provm(&["blame", path(trace), "--format", "json"]);
    assert_eq!(json.status, 0, "{}", json.stderr);
    let table: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let dd = table["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["command"] == "dd")
        .expect("dd in the JSON");
    // Each O_DIRECT block is one request at least; dd's own exits.
    assert!(dd["exits"][DISK].as_u64().unwrap() >= 128, "{dd}");
    assert!(dd["recorder_ns"].as_u64().unwrap() > 0, "{dd}");
    let total = &table["total"];
    let wall = total["wall_ns"].as_u64().unwrap();
    let parts = total["guest_ns"].as_u64().unwrap()
        + total["vmm_ns"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>()
        + total["halted_ns"].as_u64().unwrap()
        + total["recorder_ns"].as_u64().unwrap();
    assert_eq!(wall, parts);

    let csv = provm(&["blame", path(trace), "--format", "csv"]);
    assert_eq!(csv.status, 0, "{}", csv.stderr);
    let header = csv.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("pid,command,wall_ns,guest_ns"),
        "{header}"
    );
    assert!(header.contains(&format!("exits:{DISK}")), "{header}");
    assert!(
        csv.stdout.lines().any(|l| l.contains(",dd,")),
        "{}",
        csv.stdout
    );

    let svg = in_dir("blame.svg");
    let drawn = provm(&["blame", path(trace), "--svg", path(&svg)]);
    assert_eq!(drawn.status, 0, "{}", drawn.stderr);
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg"), "{picture}");
    assert!(picture.contains("<polyline"), "no CDF drawn");
    assert!(picture.contains(" dd<"), "no bar for dd");
    let again = provm(&["blame", path(trace), "--svg", path(&svg)]);
    assert_eq!(again.status, PROVM_FAILED);
    assert!(again.stderr.contains("--force"), "{}", again.stderr);

    // Timing is no input: the trace replays exactly.
    common::assert_replay_matches(trace);
}

/// The validation: sweeping an injected virtio-blk delay moves virtio-blk's
/// blame by delay x its exits (slope within 0.9..1.1) and leaves the other
/// devices' blame within the noise between two runs without delay.
#[test]
fn an_injected_exit_delay_moves_its_devices_blame_by_delay_times_exits() {
    let _guest = one_guest_at_a_time();
    let zero = [timed_run("zero-a", &[]), timed_run("zero-b", &[])];
    // Two runs without a delay and one with each: the slope's four points
    // (each run took about 13 s of this test on PVM).
    // Each delay, and as the report writes it back.
    let delays_us = [(500u64, "500us"), (1000, "1ms")];
    let swept: Vec<(u64, TimingReport)> = delays_us
        .iter()
        .map(|&(us, written)| {
            let delay = format!("{DISK}:{us}us");
            let report = timed_run(&format!("delay-{us}"), &["--inject-exit-delay", &delay]);
            assert_eq!(report.injected, Some(format!("{DISK}=+{written}")));
            (us, report)
        })
        .collect();

    let base = |name: &str| {
        (device(&zero[0], name).hypervisor_ns() + device(&zero[1], name).hypervisor_ns()) as f64
            / 2.0
    };
    let mut points: Vec<(f64, f64)> = zero
        .iter()
        .map(|report| {
            (
                0.0,
                device(report, DISK).hypervisor_ns() as f64 - base(DISK),
            )
        })
        .collect();
    println!("delay     exits   expected ms   measured ms");
    for (us, report) in &swept {
        let disk = device(report, DISK);
        let expected = (us * 1000 * disk.exits) as f64;
        let measured = disk.hypervisor_ns() as f64 - base(DISK);
        println!(
            "{us:>5}us {:>7} {:>13.3} {:>13.3}",
            disk.exits,
            expected / 1e6,
            measured / 1e6
        );
        points.push((expected, measured));
    }
    let fitted = common::slope(&points);
    println!("fitted slope {fitted:.4}");
    assert!((0.9..=1.1).contains(&fitted), "slope {fitted}: {points:?}");

    // The other devices: the delay does not leak into their blame. Each
    // moves by no more than the noise of two undelayed runs (three times
    // their difference, and never under 2 ms: a single host preemption
    // inside an exit's handling costs that much here) or 2% of the delay
    // injected, whichever is larger: two runs estimate the noise poorly,
    // and a run made longer by the delay makes a few more or fewer of their
    // exits (measured: the clock's moved 4.8 ms, 0.8%, with 589 ms injected,
    // while its two undelayed runs differed by 1.5 ms). Added to that: the
    // host's preemption of the vCPU thread measured in the runs compared,
    // which any device's exits may have absorbed (CI, with the test bed's
    // L1 on the other core: halt moved 2.9 ms with 112 ms injected).
    let preempted = |report: &TimingReport| report.total().times.preempted_ns as f64;
    let undelayed_preempted = preempted(&zero[0]).max(preempted(&zero[1]));
    for (us, report) in &swept {
        println!(
            "{us:>5}us: the host preempted the vCPU {:.3} ms (undelayed: up to {:.3} ms)",
            preempted(report) / 1e6,
            undelayed_preempted / 1e6
        );
    }
    for name in zero[0].by_device().keys().filter(|name| *name != DISK) {
        let (a, b) = (
            device(&zero[0], name).hypervisor_ns() as f64,
            device(&zero[1], name).hypervisor_ns() as f64,
        );
        for (us, report) in &swept {
            let injected = (us * 1000 * device(report, DISK).exits) as f64;
            let band = (3.0 * (a - b).abs()).max(2e6).max(0.02 * injected)
                + preempted(report)
                + undelayed_preempted;
            let moved = device(report, name).hypervisor_ns() as f64 - base(name);
            assert!(
                moved.abs() <= band,
                "{name} moved {:.3} ms with {DISK} delayed {us}us (band {:.3} ms)",
                moved / 1e6,
                band / 1e6
            );
        }
    }

    // Two runs compared: per device, with exit latency percentiles.
    let (a, b) = (in_dir("zero-a.json"), in_dir("delay-1000.json"));
    let compared = provm(&["blame", path(&a), path(&b)]);
    assert_eq!(compared.status, 0, "{}", compared.stderr);
    let disk_line = compared
        .stdout
        .lines()
        .find(|line| line.starts_with(DISK))
        .unwrap_or_else(|| panic!("{}", compared.stdout));
    // 1 ms more per exit: its median latency moves past 1 ms.
    assert!(disk_line.contains("p50: "), "{disk_line}");
    let p50_after: u64 = disk_line
        .split("p50: ")
        .nth(1)
        .and_then(|rest| rest.split(" -> ").nth(1))
        .and_then(|after| after.split_whitespace().next())
        .and_then(|us| us.parse().ok())
        .unwrap_or_else(|| panic!("{disk_line}"));
    assert!(p50_after >= 1000, "{disk_line}");
}

/// A what-if replay: each process's time under virtio-blk +2 ms, measured,
/// is its predicted time (baseline replay + 2 ms x its disk exits).
#[test]
fn a_what_if_replay_measures_what_blame_predicts() {
    let _guest = one_guest_at_a_time();
    let trace = recorded();
    let what_if = provm(&["blame", path(trace), "--what-if", "virtio-blk=+2ms"]);
    assert_eq!(what_if.status, 0, "{}", what_if.stderr);
    println!("{}", what_if.stdout);
    let dd = what_if
        .stdout
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some("dd"))
        .unwrap_or_else(|| panic!("{}", what_if.stdout));
    let numbers: Vec<f64> = dd
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    // pid, baseline, predicted, measured, then the hypervisor's three.
    let [_, baseline, predicted, _measured, hyp_base, hyp_predicted, hyp_measured] = numbers[..]
    else {
        panic!("{dd}")
    };
    // dd makes at least 128 disk exits: 256 ms more at least.
    assert!(predicted - baseline >= 256.0, "{dd}");
    assert!(hyp_predicted - hyp_base >= 256.0, "{dd}");
    // The hypervisor's share, which the change acts on, as predicted.
    let added = hyp_predicted - hyp_base;
    assert!((hyp_measured - hyp_predicted).abs() <= 0.1 * added, "{dd}");
    // The whole time is printed, not checked: the guest's own time varies
    // more between two replays on this host than the change adds (dd's
    // guest time measured 7.66 s in one replay and 6.7 s in the next, with
    // 0.6 s added), and it is the hypervisor's share the change acts on.
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let _guest = one_guest_at_a_time();
    let untimed = in_dir("untimed.provm");
    let recorded = record_shell(&images().tiny_qcow2, &untimed, &["--no-timing"], "true");
    assert_eq!(recorded.status, 0, "{}", recorded.stderr);
    let blamed = provm(&["blame", path(&untimed)]);
    assert_eq!(blamed.status, PROVM_FAILED);
    assert!(blamed.stderr.contains("has no timing"), "{}", blamed.stderr);
    let what_if = provm(&["blame", path(&untimed), "--what-if", "virtio-blk=x2"]);
    assert_eq!(what_if.status, PROVM_FAILED);
    assert!(
        what_if.stderr.contains("has no timing"),
        "{}",
        what_if.stderr
    );

    let image = path(&images().tiny_qcow2);
    for (flag, value, reason) in [
        ("--inject-exit-delay", "disk:1ms", "unknown device \"disk\""),
        ("--inject-exit-delay", "virtio-blk:2", "is not a duration"),
        ("--inject-exit-delay", "virtio-blk", "DEVICE:DURATION"),
    ] {
        let refused = provm(&["run", flag, value, image, "--", "true"]);
        assert_eq!(refused.status, 2, "{value}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(reason),
            "{value}: {}",
            refused.stderr
        );
    }
    for (value, reason) in [
        ("virtio-blk=2ms", "DEVICE=+DURATION"),
        ("virtio-blk=+2", "is not a duration"),
        ("virtio-blk=x0", "is not a factor"),
        ("blk=x2", "unknown device"),
    ] {
        let refused = provm(&["blame", path(&untimed), "--what-if", value]);
        assert_eq!(refused.status, 2, "{value}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(reason),
            "{value}: {}",
            refused.stderr
        );
    }
    // What does not replay as recorded takes no timing flags: refused, not
    // ignored, and the trace is left as it was.
    let before = std::fs::read(&untimed).unwrap();
    for (mode, timing) in [
        (&["--gdb", "127.0.0.1:1"][..], &["--timing", "t.json"][..]),
        (
            &["--fork-at", "0", "--inject", "none", "-o", "f.provm"],
            &["--inject-exit-delay", "virtio-blk:1ms"],
        ),
        (
            &["--extract-kernel", "-o", "vmlinux"],
            &["--timing", "t.json"],
        ),
    ] {
        let args: Vec<&str> = ["replay"]
            .iter()
            .chain(mode)
            .chain(timing)
            .copied()
            .chain([path(&untimed)])
            .collect();
        let refused = provm(&args);
        assert_eq!(refused.status, 2, "{args:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("cannot be used with"),
            "{args:?}: {}",
            refused.stderr
        );
    }
    assert_eq!(std::fs::read(&untimed).unwrap(), before);

    let not_a_run = in_dir("not-a-run.txt");
    std::fs::write(&not_a_run, "hello").unwrap();
    let refused = provm(&["blame", path(&not_a_run)]);
    assert_eq!(refused.status, PROVM_FAILED);
    assert!(
        refused.stderr.contains("neither a trace nor a timing file"),
        "{}",
        refused.stderr
    );
}
