//! The recorder and the replayer driven through the seam by a scripted
//! guest, without KVM: what one records, the other replays without
//! divergence; a guest that does one thing differently, or a log tampered
//! with below its checksums, diverges at exactly the event concerned.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use provm_recorder::Recorder;
use provm_replayer::{Divergence, Replayer};
use provm_trace::event_log::{chunk_frame, encode_chunk, EventStream};
use provm_trace::events::{Decoder, Encoder, Event};
use provm_trace::format::{SectionKind, TraceReader, TraceWriter};
use provm_vmm::seam::{Exit, Seam};

static NOT_INTERRUPTED: AtomicBool = AtomicBool::new(false);

const START_NS: u64 = 5_000_000_000;
/// The port the guest writes its clock readings to.
const ECHO_PORT: u16 = 0x80;

/// One crossing of the seam, as the scripted guest makes it.
#[derive(Clone, Debug)]
enum Call {
    Exit(Exit<'static>),
    ReadResult(&'static [u8]),
    /// Reads the clock, then writes the reading to `ECHO_PORT` (an exit):
    /// what a guest does next depends on what it read.
    ClockEchoed,
    Wall,
    Inject(u8),
    AgentInput(&'static [u8]),
    AgentOutput(&'static [u8]),
    DiskWrite(u64, &'static [u8]),
}

/// A guest's worth of seam calls: every kind of event.
fn script() -> Vec<Call> {
    vec![
        Call::Exit(Exit::PioRead { port: 0x40, len: 1 }),
        Call::ReadResult(&[0x12]),
        Call::ClockEchoed,
        Call::Inject(0x20),
        Call::Exit(Exit::InterruptWindow),
        Call::AgentInput(b"run job"),
        Call::Exit(Exit::MmioWrite {
            address: 0xd000_1050,
            data: &[1, 0, 0, 0],
        }),
        Call::Exit(Exit::MmioRead {
            address: 0xd000_0070,
            len: 4,
        }),
        Call::ReadResult(&[0, 0, 0, 0]),
        Call::DiskWrite(4096, &[0xab; 512]),
        Call::AgentOutput(b"hello from the guest"),
        Call::Exit(Exit::Halt),
        Call::ClockEchoed,
        Call::Wall,
        Call::AgentOutput(b"finished 0"),
    ]
}

/// Makes `calls` on `seam`; returns the clock readings the guest saw.
fn run(seam: &dyn Seam, calls: &[Call]) -> Vec<u64> {
    let mut readings = Vec::new();
    for call in calls {
        match call {
            Call::Exit(exit) => seam.exit(*exit),
            Call::ReadResult(data) => seam.read_result(data),
            Call::ClockEchoed => {
                let ns = seam.monotonic_ns();
                readings.push(ns);
                seam.exit(Exit::PioWrite {
                    port: ECHO_PORT,
                    data: &ns.to_le_bytes(),
                });
            }
            Call::Wall => readings.push(seam.wall_ns()),
            Call::Inject(vector) => seam.injected(*vector),
            Call::AgentInput(bytes) => seam.agent_input(bytes),
            Call::AgentOutput(bytes) => seam.agent_output(bytes),
            Call::DiskWrite(offset, data) => seam.disk_write(*offset, data),
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

/// Records `calls` into a trace at `path`; returns the clock readings.
fn record(path: &Path, calls: &[Call]) -> Vec<u64> {
    let recorder = Recorder::new(
        TraceWriter::create(path).unwrap(),
        START_NS,
        &NOT_INTERRUPTED,
    );
    let readings = run(&recorder, calls);
    let (trace, totals) = recorder.finish().unwrap();
    trace.finish().unwrap();
    assert_eq!(totals.events, first_event_of(calls, calls.len()));
    assert_eq!(totals.disk_writes, 1);
    readings
}

/// Replays `calls` against the trace at `path`; returns the readings the
/// guest saw and the divergence, if any.
fn replay(path: &Path, calls: &[Call]) -> (Vec<u64>, Option<Divergence>, Option<String>) {
    let replayer = Replayer::new(EventStream::open(path).unwrap(), START_NS);
    let readings = run(&replayer, calls);
    (readings, replayer.divergence(), replayer.stop_reason())
}

#[test]
fn a_recording_replays_without_divergence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let recorded = record(&path, &script());
    let (replayed, divergence, stop) = replay(&path, &script());
    assert!(divergence.is_none(), "{}", divergence.unwrap());
    assert_eq!(
        replayed, recorded,
        "the replay answers the clock from the log"
    );
    assert_eq!(stop.as_deref(), Some("the end of the log"));
}

#[test]
fn a_guest_that_does_one_thing_differently_diverges_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    record(&path, &calls);
    let different = |call: &Call| match call {
        Call::Exit(Exit::PioRead { port, len }) => Call::Exit(Exit::PioRead {
            port: port + 1,
            len: *len,
        }),
        Call::Exit(Exit::MmioWrite { address, .. }) => Call::Exit(Exit::MmioWrite {
            address: *address,
            data: &[2, 0, 0, 0],
        }),
        Call::Exit(Exit::MmioRead { address, len }) => Call::Exit(Exit::MmioRead {
            address: address + 4,
            len: *len,
        }),
        Call::Exit(Exit::Halt) => Call::Exit(Exit::InterruptWindow),
        Call::Exit(_) => Call::Exit(Exit::Halt),
        Call::ReadResult(_) => Call::ReadResult(&[0xff]),
        Call::ClockEchoed => Call::Wall,
        Call::Wall => Call::Inject(0x21),
        Call::Inject(_) => Call::Inject(0x21),
        Call::AgentInput(_) => Call::AgentInput(b"run another job"),
        Call::AgentOutput(_) => Call::AgentOutput(b"hello from another guest"),
        Call::DiskWrite(offset, data) => Call::DiskWrite(offset + 512, data),
    };
    for at in 0..calls.len() {
        let mut altered = calls.clone();
        altered[at] = different(&calls[at]);
        let (_, divergence, stop) = replay(&path, &altered);
        let divergence = divergence.unwrap_or_else(|| panic!("call {at} changed unnoticed"));
        let event = first_event_of(&calls, at);
        assert_eq!(divergence.event, event, "call {at}: {divergence}");
        let mut log = EventStream::open(&path).unwrap();
        let expected = (0..=event).map(|_| log.next_event().unwrap()).last();
        assert_eq!(divergence.expected, expected.flatten(), "call {at}");
        assert_ne!(
            divergence.actual,
            divergence.expected.as_ref().unwrap().to_string(),
            "call {at}"
        );
        assert_eq!(stop.as_deref(), Some("the replay diverged"));
    }
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
    let mut trace = TraceWriter::create(path).unwrap();
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
    let recorded = record(&path, &calls);
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
    assert_eq!(
        divergence.expected,
        Some(Event::PioWrite {
            port: ECHO_PORT,
            data: recorded[1].to_le_bytes().to_vec()
        })
    );
    assert_eq!(
        divergence.actual,
        Event::PioWrite {
            port: ECHO_PORT,
            data: recorded[0].to_le_bytes().to_vec()
        }
        .to_string()
    );
}

#[test]
fn a_tampered_agent_output_byte_diverges_at_that_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.provm");
    let calls = script();
    record(&path, &calls);
    let output_event = first_event_of(&calls, 10);
    tamper(&path, |events| match &mut events[output_event as usize] {
        Event::AgentOutput(bytes) => bytes[0] ^= 0x20,
        other => panic!("event {output_event} is {other}, not the agent output"),
    });
    let (_, divergence, _) = replay(&path, &calls);
    let divergence = divergence.expect("the output differs from the log");
    assert_eq!(divergence.event, output_event);
    assert_eq!(
        divergence.expected,
        Some(Event::AgentOutput(b"Hello from the guest".to_vec()))
    );
    assert_eq!(
        divergence.actual,
        Event::AgentOutput(b"hello from the guest".to_vec()).to_string()
    );
    assert_eq!(divergence.recent.len() as u64, output_event);
}
