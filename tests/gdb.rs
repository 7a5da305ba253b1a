//! gdb on a replay, on the real guest with Debian's gdb: a hardware
//! breakpoint in the guest kernel, `monitor where`, reverse-continue
//! through a time-travel snapshot, and the replay still matches after.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;

use common::{
    free_port, gdb_batch, images, log_events, one_guest_at_a_time, path, provm, record_shell,
    serve_gdb, PROVM_FAILED,
};

/// Opens files, several times, late in the run.
const SCRIPT: &str =
    "for i in 1 2 3 4; do cat /data/in.txt > /data/out$i.txt; done; cat /data/out4.txt";

/// The shared recording, and its log's length in events.
fn recording() -> &'static (PathBuf, u64) {
    static TRACE: OnceLock<(PathBuf, u64)> = OnceLock::new();
    TRACE.get_or_init(|| {
        let trace = common::trace_path(&images().dir, "gdb");
        let recorded = record_shell(&images().tiny_qcow2, &trace, &[], SCRIPT);
        assert_eq!(recorded.status, 0, "{}", recorded.stderr);
        let events = log_events(&trace);
        (trace, events)
    })
}

/// The event numbers `monitor where` printed, in order.
fn where_events(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|line| line.strip_prefix("event "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn gdb_stops_in_the_guest_kernel_goes_back_in_time_and_the_replay_still_matches() {
    let _guest = one_guest_at_a_time();
    let (trace, events) = recording();
    let vmlinux = trace.with_extension("vmlinux");
    let extracted = provm(&[
        "replay",
        "--extract-kernel",
        "--force",
        "-o",
        path(&vmlinux),
        path(trace),
    ]);
    assert_eq!(extracted.status, 0, "{}", extracted.stderr);

    let address = format!("127.0.0.1:{}", free_port());
    let (mut provm, stderr) = serve_gdb(trace, &address);
    // Halfway through the log first (past a snapshot or more), so that
    // going back restores one taken in the middle of the replay.
    let halfway = events / 2;
    let gdb_out = gdb_batch(
        &vmlinux,
        &address,
        &[
            &format!("monitor event {halfway}"),
            "hbreak do_sys_openat2",
            "continue",
            "monitor where",
            "continue",
            "monitor where",
            "reverse-continue",
            "monitor where",
            "monitor snapshots",
            "monitor event 999999999",
            "delete",
            "continue",
        ],
    );
    let status = provm.wait().unwrap();
    let mut stdout = String::new();
    provm
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let stderr = stderr.join().unwrap();
    let all = format!("gdb:\n{gdb_out}\nprovm:\n{stdout}{stderr}");

    // monitor event, then where at each of the three stops.
    let wheres = where_events(&gdb_out);
    assert_eq!(wheres.len(), 4, "{all}");
    let (first, second, back) = (wheres[1], wheres[2], wheres[3]);
    assert!(wheres[0] >= halfway, "{all}");
    assert!(first > wheres[0] && second > first, "{all}");
    assert_eq!(
        back, first,
        "reverse-continue went back to the first hit: {all}"
    );
    assert_eq!(
        gdb_out.matches("Breakpoint 1, ").count(),
        3,
        "stopped at do_sys_openat2 three times: {all}"
    );
    assert!(gdb_out.contains("in do_sys_openat2"), "{all}");
    // The running process, and its user registers from its saved frame.
    assert!(gdb_out.contains("running: pid "), "{all}");
    assert!(
        gdb_out.contains("user mode (saved at kernel entry): rip 0x"),
        "{all}"
    );
    // Going back went through a snapshot taken on the way.
    let kept: Option<u64> = gdb_out
        .lines()
        .find_map(|line| line.split_once(" snapshots kept"))
        .and_then(|(count, _)| count.parse().ok());
    assert!(kept.is_some_and(|kept| kept >= 2), "{all}");
    assert!(
        gdb_out.contains(&format!(
            "error: the log has {events} events; event 999999999 is past its end"
        )),
        "{all}"
    );
    // Forward to the end after going back: the replay still matches.
    assert!(
        gdb_out.contains("No more reverse-execution history"),
        "{all}"
    );
    assert_eq!(status.code(), Some(0), "{all}");
    assert!(stdout.starts_with("replay matched: "), "{all}");
    eprintln!("{all}");
}

#[test]
fn a_port_in_use_is_refused_before_the_replay_starts() {
    let _guest = one_guest_at_a_time();
    let (trace, _) = recording();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let replay = provm(&["replay", "--gdb", &address, path(trace)]);
    assert_eq!(replay.status, PROVM_FAILED, "{}", replay.stderr);
    assert!(
        replay
            .stderr
            .contains(&format!("cannot listen for gdb on {address}")),
        "{}",
        replay.stderr
    );
    assert!(
        replay.stderr.contains("choose another"),
        "{}",
        replay.stderr
    );
}
