//! The recorder and the replayer driven through the seam by a scripted
//! guest, without KVM: what one records, the other replays without
//! divergence; a guest that does one thing differently, or a log tampered
//! with below its checksums, diverges at exactly the event concerned; the
//! end of a replay is checked against the end of the recording.

use std::path::Path;
use std::time::{Duration, Instant};

use provm_guest_agent::{GuestMessage, Outcome};
use provm_seams::{
    state_check, Divergence, Expected, RecordedEnd, Recorder, ReplayEnd, Replayer, NO_HOST_REQUESTS,
};
use provm_trace::event_log::{chunk_frame, encode_chunk, EventStream};
use provm_trace::events::{self, Decoder, Encoder, Event};
use provm_trace::format::{SectionKind, SectionWriter, TraceReader};
use provm_trace::page_digests::{self, PageDifference};
use provm_vmm::clock::Clock;
use provm_vmm::memory;
use provm_vmm::seam::{Exit, Place, Seam};
use provm_vmm::state_digest::{self, MemoryDigest, StateDigest};
use provm_vmm::vm::{VmError, VmEvent};
use vm_memory::{Bytes, GuestAddress};

const START_NS: u64 = 5_000_000_000;
/// The port the guest writes its clock readings to.
const ECHO_PORT: u16 = 0x80;
/// Where the guest writes them from.
const ECHO_AT: Place = at(0xffff_ffff_8100_0080);

/// A place in the guest, with registers of its own.
const fn at(rip: u64) -> Place {
    Place {
        rip,
        registers: rip ^ 0x0123_4567_89ab_cdef,
    }
}

/// One crossing of the seam, as the scripted guest makes it.
#[derive(Clone, Debug)]
enum Call {
    Exit(Exit<'static>, Place),
    ReadResult(&'static [u8]),
    /// Reads the clock, then writes the reading to `ECHO_PORT` (an exit):
    /// what a guest does next depends on what it read.
    ClockEchoed,
    Wall,
    Inject(u8),
    AgentInput(&'static [u8]),
    AgentOutput(&'static [u8]),
    DiskWrite(u64, &'static [u8]),
    /// A state check of guest memory, with its digests.
    MemoryCheck(MemoryDigest),
}

/// A guest's worth of seam calls: every kind of event.
fn script() -> Vec<Call> {
    vec![
        Call::Exit(
            Exit::PioRead { port: 0x40, len: 1 },
            at(0xffff_ffff_8100_0040),
        ),
        Call::ReadResult(&[0x12]),
        Call::ClockEchoed,
        Call::Inject(0x20),
        Call::Exit(Exit::InterruptWindow, at(0x40_1000)),
        Call::AgentInput(b"run job"),
        Call::Exit(
            Exit::MmioWrite {
                address: 0xd000_1050,
                data: &[1, 0, 0, 0],
            },
            at(0xffff_ffff_8120_0000),
        ),
        Call::Exit(
            Exit::MmioRead {
                address: 0xd000_0070,
                len: 4,
            },
            at(0xffff_ffff_8120_0010),
        ),
        Call::ReadResult(&[0, 0, 0, 0]),
        Call::DiskWrite(4096, &[0xab; 512]),
        Call::AgentOutput(stdout(b"hello from the guest")),
        Call::Exit(Exit::Halt, at(0xffff_ffff_8100_1000)),
        Call::ClockEchoed,
        Call::Wall,
        Call::MemoryCheck(digest(0x5eed_0000_1234_5678)),
        Call::AgentOutput(finished(0)),
    ]
}

/// A memory digest whose whole is `whole` (of two pages of zeroes).
fn digest(whole: u64) -> MemoryDigest {
    MemoryDigest {
        whole,
        pieces: vec![0; 2 * page_digests::PIECES_PER_PAGE],
    }
}

/// The agent's frame of `message`, as the script holds it.
fn frame(message: GuestMessage) -> &'static [u8] {
    Box::leak(message.encode().into_boxed_slice())
}

/// The agent's report that the command exited with `status`.
fn finished(status: i32) -> &'static [u8] {
    frame(GuestMessage::Finished(Outcome::Exited(status)))
}

/// The command's output, as the agent sends it.
fn stdout(text: &[u8]) -> &'static [u8] {
    frame(GuestMessage::Stdout(text.to_vec()))
}

/// Makes `calls` on `seam`; returns the clock readings the guest saw.
fn run(seam: &dyn Seam, calls: &[Call]) -> Vec<u64> {
    let mut readings = Vec::new();
    for call in calls {
        match call {
            Call::Exit(exit, place) => seam.exit(*exit, *place),
            Call::ReadResult(data) => seam.read_result(data),
            Call::ClockEchoed => {
                let ns = seam.monotonic_ns();
                readings.push(ns);
                seam.exit(
                    Exit::PioWrite {
                        port: ECHO_PORT,
                        data: &ns.to_le_bytes(),
                    },
                    ECHO_AT,
                );
            }
            Call::Wall => readings.push(seam.wall_ns()),
            Call::Inject(vector) => seam.injected(*vector),
            Call::AgentInput(bytes) => seam.agent_input(bytes),
            Call::AgentOutput(bytes) => seam.agent_output(bytes),
            Call::DiskWrite(offset, data) => seam.disk_write(*offset, data),
            Call::MemoryCheck(digest) => seam.memory_checked(digest.clone()),
        }
    }
    readings
}

/// The index of the first event `calls` log (a `ClockEchoed` logs two).
fn first_event_of(calls: &[Call], call: usize) -> u64 {
    calls[..call]
        .iter()
        .map(|c| if matches!(c, Call::ClockEchoed) { 2 } else { 1 })
        .sum()
}

/// Records `calls` into a trace at `path`, a complete recording whose
/// command exited 0; returns the clock readings and how it ended.
fn record(path: &Path, calls: &[Call]) -> (Vec<u64>, RecordedEnd) {
    let recorder = Recorder::new(
        SectionWriter::create(path).unwrap(),
        START_NS,
        &NO_HOST_REQUESTS,
    );
    let readings = run(&recorder, calls);
    let (trace, totals) = recorder.finish().unwrap();
    trace.unwrap().finish().unwrap();
    assert_eq!(totals.events, first_event_of(calls, calls.len()));
    let end = RecordedEnd {
        complete: true,
        exit_status: Some(0),
        disk_writes_sha256: totals.disk_writes_sha256,
        exitless_limit: Duration::from_secs(60),
        final_check: None,
    };
    (readings, end)
}

/// A replayer of the trace at `path`, which ended as `end` says.
fn replayer_of(path: &Path, end: &RecordedEnd) -> Replayer {
    Replayer::new(EventStream::open(path).unwrap(), START_NS, end.clone())
}

/// Replays `calls` against the trace at `path`; returns the readings the
/// guest saw and the divergence, if any.
fn replay(path: &Path, calls: &[Call]) -> (Vec<u64>, Option<Divergence>, Option<String>) {
    let replayer = replayer_of(path, &complete());
    let readings = run(&replayer, calls);
    (readings, replayer.divergence(), replayer.stop_reason())
}

/// A complete recording's end, for the tests that check only events.
fn complete() -> RecordedEnd {
    RecordedEnd {
        complete: true,
        exit_status: None,
        disk_writes_sha256: String::new(),
        exitless_limit: Duration::from_secs(60),
        final_check: None,
    }
}

/// The divergence a replay ended with; panics on any other end.
fn diverged(end: ReplayEnd) -> Divergence {
    match end {
        ReplayEnd::Diverged { divergence, .. } => divergence,
        ReplayEnd::Matched { .. } => panic!("matched"),
        ReplayEnd::CutShort { .. } => panic!("cut short"),
    }
}

#[test]
fn a_recording_replays_without_divergence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let (recorded, end) = record(&path, &script());
    let replayer = replayer_of(&path, &end);
    let replayed = run(&replayer, &script());
    assert_eq!(
        replayed, recorded,
        "the replay answers the clock from the log"
    );
    assert_eq!(
        replayer.stop_reason().as_deref(),
        Some("the end of the log")
    );
    match replayer.finish(Ok(VmEvent::Halted), 0).unwrap() {
        ReplayEnd::Matched {
            events,
            guest_ns,
            state_checks,
        } => {
            assert_eq!(events, first_event_of(&script(), script().len()));
            assert_eq!(guest_ns, recorded[1]);
            assert_eq!(state_checks, 1);
        }
        ReplayEnd::CutShort { .. } => panic!("a complete trace replayed as cut short"),
        ReplayEnd::Diverged { divergence, .. } => panic!("{divergence}"),
    }
}

#[test]
fn a_guest_that_does_one_thing_differently_diverges_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    record(&path, &calls);
    let different = |call: &Call| match call {
        Call::Exit(Exit::PioRead { port, len }, at) => Call::Exit(
            Exit::PioRead {
                port: port + 1,
                len: *len,
            },
            *at,
        ),
        Call::Exit(Exit::MmioWrite { address, .. }, at) => Call::Exit(
            Exit::MmioWrite {
                address: *address,
                data: &[2, 0, 0, 0],
            },
            *at,
        ),
        Call::Exit(Exit::MmioRead { address, len }, at) => Call::Exit(
            Exit::MmioRead {
                address: address + 4,
                len: *len,
            },
            *at,
        ),
        Call::Exit(Exit::Halt, at) => Call::Exit(Exit::InterruptWindow, *at),
        Call::Exit(_, at) => Call::Exit(Exit::Halt, *at),
        Call::ReadResult(_) => Call::ReadResult(&[0xff]),
        Call::ClockEchoed => Call::Wall,
        Call::Wall => Call::Inject(0x21),
        Call::Inject(_) => Call::Inject(0x21),
        Call::AgentInput(_) => Call::AgentInput(b"run another job"),
        Call::AgentOutput(_) => Call::AgentOutput(stdout(b"hello from another guest")),
        Call::DiskWrite(offset, data) => Call::DiskWrite(offset + 512, data),
        Call::MemoryCheck(digest) => Call::MemoryCheck(self::digest(digest.whole ^ 1)),
    };
    for at in 0..calls.len() {
        let mut altered = calls.clone();
        altered[at] = different(&calls[at]);
        let (_, divergence, stop) = replay(&path, &altered);
        let divergence = divergence.unwrap_or_else(|| panic!("call {at} changed unnoticed"));
        let event = first_event_of(&calls, at);
        assert_eq!(divergence.event, event, "call {at}: {divergence}");
        assert_eq!(divergence.expected, logged(&path, event), "call {at}");
        assert_ne!(
            divergence.actual,
            divergence.expected.to_string(),
            "call {at}"
        );
        assert_eq!(stop.as_deref(), Some("the replay diverged"));
    }
}

/// Event `index` of the trace at `path`, as a divergence expects it.
fn logged(path: &Path, index: u64) -> Expected {
    let mut log = EventStream::open(path).unwrap();
    let event = (0..=index).map(|_| log.next_event().unwrap()).last();
    Expected::Event(event.flatten().expect("the log holds the event"))
}

/// Exits that look alike (same port, same data) but happen elsewhere or in
/// another register state are not the same: the replay diverges there.
#[test]
fn an_exit_at_another_place_or_register_state_diverges_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    record(&path, &calls);
    let moves: [fn(Place) -> Place; 2] = [
        |place| Place {
            rip: place.rip + 2,
            ..place
        },
        |place| Place {
            registers: place.registers ^ 1,
            ..place
        },
    ];
    for (at, call) in calls.iter().enumerate() {
        let Call::Exit(exit, place) = call else {
            continue;
        };
        for moved in moves {
            let mut altered = calls.clone();
            altered[at] = Call::Exit(*exit, moved(*place));
            let (_, divergence, _) = replay(&path, &altered);
            let divergence = divergence.unwrap_or_else(|| panic!("call {at} moved unnoticed"));
            assert_eq!(divergence.event, first_event_of(&calls, at), "call {at}");
            assert_eq!(divergence.expected, logged(&path, divergence.event));
            let place = moved(*place);
            let place = events::Place {
                rip: place.rip,
                registers: place.registers,
            };
            assert!(
                divergence.actual.ends_with(&place.to_string()),
                "{divergence}"
            );
        }
    }
}

/// A VM that fails mid-replay (here a triple fault) is a divergence at the
/// event the log holds next, with the exits before it, not an error.
#[test]
fn a_vm_failure_mid_replay_is_a_divergence_at_the_next_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    let (_, end) = record(&path, &calls);
    let replayer = replayer_of(&path, &end);
    run(&replayer, &calls[..7]);
    let failed = replayer.finish(Err(VmError::TripleFault { rip: 0x1234 }), 0x1234);
    let divergence = diverged(failed.unwrap());
    assert_eq!(divergence.event, first_event_of(&calls, 7));
    assert_eq!(divergence.exit, 4);
    assert_eq!(divergence.expected, logged(&path, divergence.event));
    assert!(
        divergence.actual.contains("the guest triple-faulted"),
        "{divergence}"
    );
    let timeout = replayer_of(&path, &end).finish(Err(VmError::Timeout { rip: 0 }), 0);
    assert!(matches!(timeout, Err(VmError::Timeout { .. })));
}

/// A recording cut short whose log ends on a clock reading: whatever the
/// replayed guest does next (an exit, or nothing before a kick stops it),
/// the replay stops there and says the trace was cut short. The same log
/// from a complete recording would diverge at such an exit.
#[test]
fn a_log_cut_after_a_clock_reading_always_replays_as_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let cut = [
        Call::Exit(Exit::Halt, at(0xffff_ffff_8100_1000)),
        Call::ClockEchoed,
        Call::Wall,
    ];
    let recorder = Recorder::new(
        SectionWriter::create(&path).unwrap(),
        START_NS,
        &NO_HOST_REQUESTS,
    );
    run(&recorder, &cut);
    // The last reading, the clock of the run loop's next turn, is logged;
    // the exit the guest made after it is not: the recording ended between.
    recorder.monotonic_ns();
    let (trace, _) = recorder.finish().unwrap();
    trace.unwrap().finish().unwrap();
    let next_exit = Call::Exit(
        Exit::MmioWrite {
            address: 0xd000_1050,
            data: &[1, 0, 0, 0],
        },
        at(0xffff_ffff_8120_0000),
    );
    let cut_short = RecordedEnd {
        complete: false,
        ..complete()
    };
    for after_the_log in [vec![], vec![next_exit.clone()]] {
        let replayer = replayer_of(&path, &cut_short);
        run(&replayer, &cut);
        replayer.monotonic_ns();
        run(&replayer, &after_the_log);
        assert_eq!(
            replayer.stop_reason().as_deref(),
            Some("the end of the log")
        );
        let stopped = Err(VmError::Stopped("the end of the log".into()));
        match replayer.finish(stopped, 0).unwrap() {
            ReplayEnd::CutShort { events, .. } => assert_eq!(events, 5),
            ReplayEnd::Matched { .. } => panic!("a cut trace matched as complete"),
            ReplayEnd::Diverged { divergence, .. } => panic!("{divergence}"),
        }
    }
    let replayer = replayer_of(&path, &complete());
    run(&replayer, &cut);
    replayer.monotonic_ns();
    run(&replayer, &[next_exit]);
    let divergence = replayer.divergence().expect("an exit past a complete log");
    assert_eq!(
        (divergence.event, divergence.expected),
        (5, Expected::EndOfLog)
    );
}

/// A complete trace replayed to its end must also end as the recording did:
/// the same exit status, the same disk writes.
#[test]
fn a_replay_ending_with_another_exit_status_or_disk_writes_diverges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    let (_, end) = record(&path, &calls);
    let events = first_event_of(&calls, calls.len());
    let other_status = RecordedEnd {
        exit_status: Some(1),
        ..end.clone()
    };
    let other_disk = RecordedEnd {
        disk_writes_sha256: "0".repeat(64),
        ..end.clone()
    };
    for (recorded, expected, actual) in [
        (
            other_status,
            "exit status 1".to_owned(),
            "exit status 0".to_owned(),
        ),
        (
            other_disk,
            format!("disk writes with SHA-256 {}", "0".repeat(64)),
            format!("disk writes with SHA-256 {}", end.disk_writes_sha256),
        ),
    ] {
        let replayer = replayer_of(&path, &recorded);
        run(&replayer, &calls);
        let divergence = diverged(replayer.finish(Ok(VmEvent::Halted), 0).unwrap());
        assert_eq!(divergence.event, events);
        assert_eq!(divergence.expected, Expected::Outcome(expected));
        assert_eq!(divergence.actual, actual);
    }
    let replayer = replayer_of(&path, &end);
    run(&replayer, &calls);
    let stopped = Err(VmError::Stopped("the end of the log".into()));
    let divergence = diverged(replayer.finish(stopped, 0).unwrap());
    assert_eq!(
        divergence.expected,
        Expected::Outcome("the guest's power-off".into())
    );
}

/// A replayed guest that goes far longer than the recording allows without
/// the exit the log says comes next is stopped as a divergence there; the
/// time before a late search's rollback does not count.
#[test]
fn a_guest_spinning_where_the_recording_exited_diverges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    let (_, end) = record(&path, &calls);
    let impatient = RecordedEnd {
        exitless_limit: Duration::from_millis(20),
        ..end
    };
    let replayer = replayer_of(&path, &impatient);
    // Next in the log: the clock reading before an echo, not an exit.
    run(&replayer, &calls[..2]);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(replayer.stop_reason(), None);
    // Next: the interrupt window exit.
    run(&replayer, &calls[2..4]);
    assert_eq!(replayer.stop_reason(), None, "it has just exited");
    // A late search's rollback undid what the guest ran: timed afresh.
    std::thread::sleep(Duration::from_millis(30));
    replayer.rolled_back();
    assert_eq!(replayer.stop_reason(), None, "it was rolled back");
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        replayer.stop_reason().as_deref(),
        Some("the replay diverged")
    );
    let divergence = replayer.divergence().unwrap();
    assert_eq!(divergence.event, first_event_of(&calls, 4));
    assert_eq!(divergence.expected, logged(&path, divergence.event));
    assert!(
        divergence.actual.starts_with("no VM exit for"),
        "{divergence}"
    );
}

/// A search for a logged preemption whose stops at its place are slow
/// (an emulated CPU) is not taken for a spin while it keeps stopping
/// there, but it is bounded in all: a guest that diverged before the
/// place passes it in other states for ever.
#[test]
fn a_search_stopping_at_the_logged_place_is_timed_afresh_but_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    let (_, end) = record(&path, &calls);
    let limit = Duration::from_millis(200);
    let replayer = replayer_of(
        &path,
        &RecordedEnd {
            exitless_limit: limit,
            ..end
        },
    );
    // Next: the interrupt window exit.
    run(&replayer, &calls[..4]);
    let exited = Instant::now();
    // A stop every 20 ms, far within the limit; five limits in all.
    let stopped = loop {
        std::thread::sleep(Duration::from_millis(20));
        replayer.passed_logged_stop();
        if replayer.stop_reason().is_some() {
            break exited.elapsed();
        }
        assert!(exited.elapsed() < 3 * 5 * limit, "the search is unbounded");
    };
    assert!(stopped >= 4 * limit, "stopped as a spin after {stopped:?}");
    let divergence = replayer.divergence().unwrap();
    assert_eq!(divergence.event, first_event_of(&calls, 4));
    assert!(
        divergence.actual.ends_with("in other states only"),
        "{divergence}"
    );
}

/// Rewrites the log of the trace at `path` (one chunk) through `edit`, with
/// fresh checksums: damage that only the replay can find.
fn tamper(path: &Path, edit: impl FnOnce(&mut Vec<Event>)) {
    let mut reader = TraceReader::open(path).unwrap();
    let mut sections = Vec::new();
    while let Some(section) = reader.next_section().unwrap() {
        sections.push(section);
    }
    assert_eq!(sections.len(), 1, "the script fits one chunk");
    let chunk = zstd::decode_all(chunk_frame(&sections[0], 0).unwrap()).unwrap();
    let mut events = Decoder::default().decode_all(&chunk).unwrap();
    edit(&mut events);
    let mut encoded = Vec::new();
    let mut encoder = Encoder::default();
    for event in &events {
        encoder.encode(event, &mut encoded);
    }
    let mut trace = SectionWriter::create(path).unwrap();
    trace
        .section(SectionKind::Events, &encode_chunk(0, &encoded).unwrap())
        .unwrap();
    trace.finish().unwrap();
}

#[test]
fn a_tampered_clock_reading_diverges_at_the_output_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    let (recorded, _) = record(&path, &calls);
    // The second reading, made earlier: still a monotonic clock.
    let clock_event = first_event_of(&calls, 12);
    tamper(&path, |events| {
        events[clock_event as usize] = Event::Clock(recorded[0]);
    });
    let (replayed, divergence, _) = replay(&path, &calls);
    assert_eq!(replayed[..2], [recorded[0], recorded[0]]);
    let divergence = divergence.expect("the echoed reading differs");
    // The clock is an input: the replay feeds it, and the guest's next
    // output, which depends on it, is where the log and the guest part.
    assert_eq!(divergence.event, clock_event + 1);
    let echo = |ns: u64| Event::PioWrite {
        port: ECHO_PORT,
        data: ns.to_le_bytes().to_vec(),
        at: events::Place {
            rip: ECHO_AT.rip,
            registers: ECHO_AT.registers,
        },
    };
    assert_eq!(divergence.expected, Expected::Event(echo(recorded[1])));
    assert_eq!(divergence.actual, echo(recorded[0]).to_string());
}

#[test]
fn a_tampered_agent_output_byte_diverges_at_that_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    record(&path, &calls);
    let output_event = first_event_of(&calls, 10);
    tamper(&path, |events| match &mut events[output_event as usize] {
        Event::AgentOutput(bytes) => *bytes.last_mut().unwrap() ^= 0x20,
        other => panic!("event {output_event} is {other}, not the agent output"),
    });
    let (_, divergence, _) = replay(&path, &calls);
    let divergence = divergence.expect("the output differs from the log");
    assert_eq!(divergence.event, output_event);
    assert_eq!(
        divergence.expected,
        Expected::Event(Event::AgentOutput(stdout(b"hello from the guesT").to_vec()))
    );
    assert_eq!(
        divergence.actual,
        Event::AgentOutput(stdout(b"hello from the guest").to_vec()).to_string()
    );
    assert_eq!(divergence.recent.len() as u64, output_event);
}

#[test]
fn a_replay_rewound_to_a_checkpoint_goes_on_as_before_and_still_matches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    let (recorded, end) = record(&path, &calls);
    let replayer = replayer_of(&path, &end);
    let half = calls.len() / 2;
    let first = run(&replayer, &calls[..half]);
    // A pause is due once the log reaches the event asked for, and once.
    let position = replayer.position().events;
    replayer.pause_at(Some(position + 1));
    assert!(!replayer.pause_here());
    replayer.pause_at(Some(position));
    assert!(replayer.pause_here());
    assert!(!replayer.pause_here());

    let checkpoint = replayer.checkpoint();
    assert_eq!(checkpoint.position(), replayer.position());
    let rest = run(&replayer, &calls[half..]);
    assert_eq!([first.clone(), rest.clone()].concat(), recorded);
    replayer
        .rewind(&checkpoint, EventStream::open(&path).unwrap())
        .unwrap();
    assert_eq!(replayer.position(), checkpoint.position());
    let again = run(&replayer, &calls[half..]);
    assert_eq!(again, rest, "the same clock readings after the rewind");
    match replayer.finish(Ok(VmEvent::Halted), 0).unwrap() {
        ReplayEnd::Matched { events, .. } => {
            assert_eq!(events, first_event_of(&calls, calls.len()))
        }
        ReplayEnd::CutShort { .. } => panic!("cut short"),
        ReplayEnd::Diverged { divergence, .. } => panic!("{divergence}"),
    }
}

/// A replay whose guest memory differs at a state check diverges there,
/// saying so, though every output matched.
#[test]
fn a_memory_check_that_differs_is_a_divergence_named_by_its_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    record(&path, &calls);
    let at = calls
        .iter()
        .position(|call| matches!(call, Call::MemoryCheck(_)))
        .unwrap();
    let mut altered = calls.clone();
    altered[at] = Call::MemoryCheck(digest(7));
    let (_, divergence, _) = replay(&path, &altered);
    let event = first_event_of(&calls, at);
    assert_eq!(
        divergence.unwrap().actual,
        format!("state check at event {event}: memory differs (digest 0000000000000007)")
    );
}

/// A byte of guest memory that differs at a state check is named by its
/// page and the piece of it that holds the byte, from the page digests
/// the recording kept (who owns the page needs a Linux guest: the RDTSC
/// probe in tests/suite/state_check.rs names it there).
#[test]
fn a_byte_corrupted_in_memory_is_named_by_its_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let ram = memory::create(memory::MIN_MEMORY_MIB).unwrap();
    ram.write_slice(b"the recorded bytes", GuestAddress(0x12_3450))
        .unwrap();
    let mut calls = script();
    let at = calls
        .iter()
        .position(|call| matches!(call, Call::MemoryCheck(_)))
        .unwrap();
    calls[at] = Call::MemoryCheck(state_digest::memory(&ram));
    let recorder = Recorder::new(
        SectionWriter::create(&path).unwrap(),
        START_NS,
        &NO_HOST_REQUESTS,
    );
    run(&recorder, &calls);
    let kept = page_digests::decode(&recorder.page_digests().unwrap()).unwrap();
    let (trace, _) = recorder.finish().unwrap();
    trace.unwrap().finish().unwrap();

    ram.write_slice(b"X", GuestAddress(0x12_3456)).unwrap();
    calls[at] = Call::MemoryCheck(state_digest::memory(&ram));
    let replayer = replayer_of(&path, &complete()).with_page_digests(kept);
    run(&replayer, &calls);
    let divergence = replayer.divergence().expect("memory differs");
    assert!(divergence.actual.contains("memory differs"), "{divergence}");
    assert_eq!(
        divergence.pages,
        Some(vec![PageDifference {
            address: 0x12_3000,
            first_piece: 0x400,
        }])
    );
}

/// The machine's state at the power-off is compared with the recording's:
/// a device that differs is named, and an equal state counts as a check.
#[test]
fn the_final_state_check_names_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let (_, end) = record(&path, &script());
    let state = |pit: u64| StateDigest {
        memory: digest(1),
        registers: 2,
        register_parts: Vec::new(),
        registers_with_stale_events: 2,
        registers_at_tsc_rate: Default::default(),
        devices: vec![("pic", 3), ("pit", pit)],
    };
    let checked = RecordedEnd {
        final_check: Some(state_check::recorded(&state(4))),
        ..end
    };
    let events = first_event_of(&script(), script().len());
    for (replayed, differs) in [(state(4), None), (state(5), Some("device pit differs"))] {
        let replayer = replayer_of(&path, &checked);
        run(&replayer, &script());
        assert!(replayer.final_check_due());
        replayer.final_state(&replayed);
        match (replayer.finish(Ok(VmEvent::Halted), 0).unwrap(), differs) {
            (ReplayEnd::Matched { state_checks, .. }, None) => assert_eq!(state_checks, 2),
            (ReplayEnd::Diverged { divergence, .. }, Some(what)) => assert_eq!(
                divergence.actual,
                format!("state check at event {events}: {what}")
            ),
            (end, _) => panic!("{differs:?}: {end:?}"),
        }
    }
}
