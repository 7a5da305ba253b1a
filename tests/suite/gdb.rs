//! gdb on a replay, on the real guest with Debian's gdb: a hardware
//! breakpoint in the guest kernel, `monitor where`, reverse-continue
//! through a time-travel snapshot, reverse-stepi, and the replay still
//! matches after.

use crate::common;

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::OnceLock;

use common::{
    agent_outputs, free_port, gdb_batch, images, log_events, one_guest_at_a_time, path, provm,
    record_shell, serve_gdb, PROVM_FAILED,
};

/// A time-travel snapshot every this many events (`--snapshot-every`): a
/// quarter of the default, so that the way to the opens passes one on
/// every host (their middle was at event 1,075 on the SVM test bed, 1,811
/// on PVM); the exit the replay goes to is chosen past it.
const SNAPSHOT_EVERY: u64 = 500;

/// Opens files, several times, after a line to stdout that marks where the
/// opens begin in the log (the agent forwards output as it comes: an
/// "agent output" event). The replay goes to the middle of the opens, not
/// of the log: a stop in the guest's work before them (the snapshot's
/// resumption, the shell's start) fell between two VM exits far apart on
/// the SVM test bed, where a reverse-stepi then single-stepped that long
/// stretch for two minutes. 16 opens: 48 took 45 s more of guest time on
/// PVM (60 s in all), and the middle was no better placed. Nor is any
/// fixed place: where the exits fall differs from one recording to the
/// next, and the same test's reverse-stepi took 3 s on one recording and
/// 45 s on another (a stretch of 245 ms of guest time). So the replay goes
/// to the exit with the shortest stretch before it (by the clock read at
/// each exit) in the first half of the opens, which leaves opens after it
/// to stop at.
const SCRIPT: &str = "echo opening; for i in $(seq 16); do cat /data/in.txt > /data/out$i.txt; done; cat /data/out16.txt";

/// The shared recording, its log's length in events, and the exit among
/// its opens that the replay goes to (see `SCRIPT`).
struct Recording {
    trace: PathBuf,
    events: u64,
    among_the_opens: u64,
}

fn recording() -> &'static Recording {
    static RECORDING: OnceLock<Recording> = OnceLock::new();
    RECORDING.get_or_init(|| {
        let trace = common::trace_path(&common::scratch(module_path!()), "gdb");
        let recorded = record_shell(&images().tiny_qcow2, &trace, &[], SCRIPT);
        assert_eq!(recorded.status, 0, "{}", recorded.stderr);
        let events = log_events(&trace);
        // The marker's output and the last file's: the opens lie between.
        let at = agent_outputs(&trace);
        assert!(at.len() >= 2, "the opens are not marked in the log: {at:?}");
        let (first, middle) = (at[0].max(SNAPSHOT_EVERY + 1), (at[0] + at[1]) / 2);
        let shortest = provm(&[
            "query",
            "--format",
            "csv",
            path(&trace),
            &format!(
                "WITH at_exit AS (SELECT exit, MIN(idx) AS event, \
                   MAX(CASE WHEN kind = 'clock' THEN guest_ns END) AS ns FROM events GROUP BY exit), \
                 stretches AS (SELECT event, ns - LAG(ns) OVER (ORDER BY exit) AS stretch FROM at_exit) \
                 SELECT event FROM stretches WHERE event BETWEEN {first} AND {middle} \
                   AND stretch IS NOT NULL ORDER BY stretch, event LIMIT 1"
            ),
        ]);
        assert_eq!(shortest.status, 0, "{}", shortest.stderr);
        let among_the_opens = shortest
            .stdout
            .lines()
            .nth(1)
            .and_then(|line| line.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "no exit with a clock between events {first} and {middle} (the first half \
                     of the opens, past the first snapshot): {}",
                    shortest.stdout
                )
            });
        Recording {
            among_the_opens,
            trace,
            events,
        }
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

/// The values gdb printed for `p/x $pc`, in order.
fn printed_pcs(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|line| line.strip_prefix('$')?.split_once(" = 0x"))
        .filter_map(|(_, hex)| u64::from_str_radix(hex.trim(), 16).ok())
        .collect()
}

#[test]
fn gdb_stops_in_the_guest_kernel_goes_back_in_time_and_the_replay_still_matches() {
    let _guest = one_guest_at_a_time();
    let Recording {
        trace,
        events,
        among_the_opens,
    } = recording();
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
    let (mut provm, stderr) = serve_gdb(trace, &address, SNAPSHOT_EVERY);
    // Among the opens first (past a snapshot or more), so that going back
    // restores one taken in the middle of the replay.
    assert!(
        *among_the_opens > SNAPSHOT_EVERY,
        "the opens (their middle at event {among_the_opens}) come too early to pass a time-travel snapshot on the way"
    );
    // Before the hit, counted from the last VM exit, on every host. On
    // PVM this step once failed whenever the stretch before the hit
    // returned to user mode: PVM gave the user process the trap flag's
    // debug exception (SIGTRAP), so the stepped run left the recorded one;
    // a step over SYSRET or IRET to user mode now goes without the flag
    // (`arm_past_user_mode`). Where the host steps with breakpoints (SVM,
    // VMX) the step back stayed on the hit or went elsewhere (the SVM test
    // bed, 6.1 and 6.12): a step kicked out of the guest by a signal before
    // it reached its breakpoints was armed again from where the kick left
    // it, so the re-execution that counts the steps to the hit and the one
    // that goes to the step before it stepped differently (they parted at
    // a user instruction whose page fault ran wp_page_copy); a kicked step
    // now goes on to its breakpoints (`Vm::arm_breakpoint_step`). And a
    // step over an IRET whose frame has RF set ran on past the place it
    // returned to; such an IRET is stepped with the trap flag
    // (`breakpoint_step`). And once in many runs on the SVM test bed (6.12)
    // the step back from the hit landed on the hit: the re-execution to the
    // instruction before it went another way than the one that counted the
    // steps to the hit. A reverse step now checks where it lands, point and
    // RIP, and re-executes again where they differ (`Debuggee::reverse_step`).
    let before_the_hit = ["reverse-stepi", "p/x $pc", "stepi", "p/x $pc"];
    let monitor_event = format!("monitor event {among_the_opens}");
    let commands: Vec<&str> = [
        monitor_event.as_str(),
        // Back over the VM exit that ended there.
        "reverse-stepi",
        "monitor where",
        "hbreak do_sys_openat2",
        "continue",
        "monitor where",
        "continue",
        "monitor where",
        "reverse-continue",
        "monitor where",
        // Three steps, back one: where the second left off.
        "p/x $pc",
        "stepi",
        "p/x $pc",
        "stepi",
        "p/x $pc",
        "stepi",
        "p/x $pc",
        "reverse-stepi",
        "p/x $pc",
        "monitor where",
        // Back to the hit, then before it (counted from the last exit),
        // and forward onto it again.
        "reverse-stepi",
        "reverse-stepi",
        "p/x $pc",
    ]
    .into_iter()
    .chain(before_the_hit)
    .chain([
        "monitor snapshots",
        "monitor event 999999999",
        "delete",
        "continue",
    ])
    .collect();
    let gdb_out = gdb_batch(&vmlinux, &address, &commands);
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

    // monitor event, reverse-stepi, then where at each of the three stops
    // and after a reverse-stepi.
    let wheres = where_events(&gdb_out);
    assert_eq!(wheres.len(), 6, "{all}");
    let (first, second, back) = (wheres[2], wheres[3], wheres[4]);
    assert!(wheres[0] >= *among_the_opens, "{all}");
    assert!(
        wheres[1] < wheres[0],
        "reverse-stepi from the pause after a VM exit went before that exit: {all}"
    );
    // Continued from where the reverse-stepi left it: the first hit may
    // come before the exit it stepped back over, in the same stretch.
    assert!(first >= wheres[1] && second > first, "{all}");
    assert_eq!(
        back, first,
        "reverse-continue went back to the first hit: {all}"
    );
    assert_eq!(
        wheres[5], back,
        "a reverse-stepi within the stretch stays at its event: {all}"
    );
    // The hit, three steps, one back, two more back, before the hit, on it.
    let pcs = printed_pcs(&gdb_out);
    assert_eq!(pcs.len(), 8, "{all}");
    let hit = pcs[0];
    assert!(
        pcs[1] != hit && pcs[2] != pcs[1] && pcs[3] != pcs[2],
        "stepi moved: {all}"
    );
    assert_eq!(pcs[4], pcs[2], "reverse-stepi went back one step: {all}");
    assert_eq!(pcs[5], hit, "two more went back to the hit: {all}");
    assert_ne!(pcs[6], hit, "one more went before the hit: {all}");
    assert_eq!(pcs[7], hit, "stepi from there reached the hit again: {all}");
    // Three stops there, and a reverse-stepi and a stepi that land on it.
    assert_eq!(
        gdb_out.matches("Breakpoint 1, ").count(),
        5,
        "stopped at do_sys_openat2 that often: {all}"
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
    let trace = &recording().trace;
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
    // No snapshots at all is no interval, and they are only gdb's.
    for args in [
        &["--gdb", &address, "--snapshot-every", "0"][..],
        &["--snapshot-every", "100"],
    ] {
        let refused = provm(&[&["replay"], args, &[path(trace)]].concat());
        assert_eq!(refused.status, 2, "{args:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("--snapshot-every"),
            "{}",
            refused.stderr
        );
    }
}
