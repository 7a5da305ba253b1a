//! Two runs' event logs read in step: the first event where they part,
//! named as the input it is (a clock, the job's entropy, what a device
//! returned, a network reply), and what each run's agent said.
//!
//! Both runs start from the booted guest's snapshot and the guest is
//! deterministic given its inputs, so the logs agree until an input
//! differs; the first difference is that input, or, when it is something
//! the guest did, a sign of an input provm does not log.

use std::fmt;

use provm_guest_agent::{EntryContent, HostMessage, Job};
use provm_trace::events::Event;
use provm_trace::format::FormatError;
use provm_trace::reader::Trace;
use provm_vmm::vm::{mmio_device, port_device};

use provm_engine::utc::date_time;

use crate::agent_outputs::AgentOutputs;

/// An event's value is shown up to this many characters.
const VALUE_WIDTH: usize = 100;

/// Both logs, read to their ends.
pub struct Walked {
    /// `None` when the logs are the same, event for event.
    pub parting: Option<Parting>,
    pub runs: [RunLog; 2],
}

/// What one run's log holds that a comparison needs.
#[derive(Default)]
pub struct RunLog {
    pub events: u64,
    pub outputs: AgentOutputs,
    /// The job the host sent (its outputs name the files copied back).
    pub job: Option<Job>,
}

/// Where two logs part: the first event that differs.
#[derive(Debug, PartialEq, Eq)]
pub struct Parting {
    /// Its position in both logs, from 0 (`provm query`'s `events.idx`).
    pub index: u64,
    /// Each log's event there; `None` where that log had ended.
    pub events: [Option<Event>; 2],
    pub source: Source,
    /// The device whose read the input answered, or whose exit the guest
    /// parted at.
    pub device: Option<&'static str>,
    /// Where the job (the same in both, before the parting) put its
    /// inputs, to name an input file by.
    inputs: Vec<String>,
}

/// What kind of input the parting event is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Clock,
    WallClock,
    /// What a device returned to a read (the device is the parting's).
    DeviceRead,
    /// The job the host sent: these of its fields differ (`JOB_FIELDS`).
    Job(Vec<&'static str>),
    InputData,
    Stdin,
    /// Another message of the host to the agent.
    HostMessage,
    NetworkReply,
    Interrupt,
    Schedule,
    Preemption,
    /// Neither event is an input: the guest itself acted differently.
    Guest,
    /// One log ended there.
    End,
}

/// Reads both traces' logs to their ends; a log that cannot be read fails
/// with its run's index (0 or 1).
pub fn walk(traces: [&Trace; 2]) -> Result<Walked, (usize, FormatError)> {
    let mut a = traces[0].events().map_err(|error| (0, error))?;
    let mut b = traces[1].events().map_err(|error| (1, error))?;
    let mut walker = Walker::default();
    loop {
        let events = [
            a.next_event().map_err(|error| (0, error))?,
            b.next_event().map_err(|error| (1, error))?,
        ];
        if events.iter().all(Option::is_none) {
            return Ok(walker.walked());
        }
        walker.step(events);
    }
}

#[derive(Default)]
struct Walker {
    index: u64,
    /// The device of the last exit both logs agree on.
    read_device: Option<&'static str>,
    parting: Option<Parting>,
    runs: [RunLog; 2],
}

impl Walker {
    fn step(&mut self, events: [Option<Event>; 2]) {
        if self.parting.is_none() {
            if events[0] != events[1] {
                let inputs = self.runs[0].job.as_ref().map_or(Vec::new(), |job| {
                    job.inputs
                        .iter()
                        .map(|input| String::from_utf8_lossy(input).into_owned())
                        .collect()
                });
                self.parting = Some(Parting::of(
                    self.index,
                    events.clone(),
                    self.read_device,
                    inputs,
                ));
            } else if let Some(exit) = events[0].as_ref().filter(|event| event.is_exit()) {
                self.read_device = device(exit);
            }
        }
        for (run, event) in self.runs.iter_mut().zip(events) {
            if let Some(event) = event {
                run.take(event);
            }
        }
        self.index += 1;
    }

    fn walked(self) -> Walked {
        Walked {
            parting: self.parting,
            runs: self.runs,
        }
    }
}

impl RunLog {
    fn take(&mut self, event: Event) {
        self.events += 1;
        match event {
            Event::AgentOutput(bytes) => self.outputs.push(&bytes),
            Event::AgentInput(bytes) if self.job.is_none() => {
                if let Some(HostMessage::Run(job)) = HostMessage::of_frame(&bytes) {
                    self.job = Some(job);
                }
            }
            _ => {}
        }
    }
}

/// The device an exit addressed.
fn device(exit: &Event) -> Option<&'static str> {
    match exit {
        Event::PioRead { port, .. } | Event::PioWrite { port, .. } => Some(port_device(*port)),
        Event::MmioRead { address, .. } | Event::MmioWrite { address, .. } => {
            Some(mmio_device(*address))
        }
        Event::MsrRead { .. } => Some("msr"),
        _ => None,
    }
}

impl Parting {
    fn of(
        index: u64,
        events: [Option<Event>; 2],
        read_device: Option<&'static str>,
        inputs: Vec<String>,
    ) -> Parting {
        let source = match &events {
            [Some(a), Some(b)] => source(a, b)
                .or_else(|| source(b, a))
                .unwrap_or(Source::Guest),
            _ => Source::End,
        };
        let device = match source {
            Source::DeviceRead => read_device,
            // An exit where the guest parted names its device.
            Source::Guest => events.iter().flatten().find_map(device),
            _ => None,
        };
        Parting {
            index,
            events,
            source,
            device,
            inputs,
        }
    }

    /// What run `side` (0 or 1) had at the parting, for people.
    pub fn value(&self, side: usize) -> String {
        let Some(event) = &self.events[side] else {
            return "its log ends here".into();
        };
        if let (Source::Job(fields), Some(job)) = (&self.source, job_of(event)) {
            return fields
                .iter()
                .map(|field| format!("{field} {}", job_field(&job, field)))
                .collect::<Vec<_>>()
                .join(", ");
        }
        let shown = match host_message(event) {
            Some(HostMessage::Entry(entry)) => {
                let root = self.inputs.get(entry.tree as usize);
                let under = String::from_utf8_lossy(&entry.path);
                let path = match root {
                    Some(root) => joined(root, &under),
                    None => format!("input {}: {under}", entry.tree),
                };
                match entry.content {
                    EntryContent::Data(bytes) => {
                        format!("{path}: {:?}", String::from_utf8_lossy(&bytes))
                    }
                    other => format!("{path}: {other:?}"),
                }
            }
            Some(HostMessage::Stdin(bytes)) => {
                format!("stdin {:?}", String::from_utf8_lossy(&bytes))
            }
            _ => event.to_string(),
        };
        match shown.char_indices().nth(VALUE_WIDTH) {
            Some((cut, _)) => format!("{}...", &shown[..cut]),
            _ => shown,
        }
    }
}

/// What input `event` is, given the other log's event at the same place;
/// `None` if it is not an input (an exit, or something the guest sent).
fn source(event: &Event, other: &Event) -> Option<Source> {
    Some(match event {
        Event::Clock(_) => Source::Clock,
        Event::Wall(_) => Source::WallClock,
        Event::ReadResult(_) => Source::DeviceRead,
        Event::NetReceived(_) => Source::NetworkReply,
        Event::Inject(_) => Source::Interrupt,
        Event::Switch(_) => Source::Schedule,
        Event::Preempted { .. } => Source::Preemption,
        Event::AgentInput(_) => match host_message(event) {
            Some(HostMessage::Run(job)) => Source::Job(match job_of(other) {
                Some(theirs) => JOB_FIELDS
                    .iter()
                    .filter(|(_, of)| of(&job) != of(&theirs))
                    .map(|(name, _)| *name)
                    .collect(),
                None => vec!["command"],
            }),
            Some(HostMessage::Entry(_)) => Source::InputData,
            Some(HostMessage::Stdin(_)) => Source::Stdin,
            _ => Source::HostMessage,
        },
        _ => return None,
    })
}

/// The guest path of `under` in a tree (an input or an output) at `root`.
pub fn joined(root: &str, under: &str) -> String {
    match under {
        "" => root.to_owned(),
        under => format!("{}/{under}", root.trim_end_matches('/')),
    }
}

/// The message of the host's an agent input carries.
fn host_message(event: &Event) -> Option<HostMessage> {
    match event {
        Event::AgentInput(bytes) => HostMessage::of_frame(bytes),
        _ => None,
    }
}

fn job_of(event: &Event) -> Option<Job> {
    match host_message(event)? {
        HostMessage::Run(job) => Some(job),
        _ => None,
    }
}

/// One of a job's fields, as people read it.
type JobField = fn(&Job) -> String;

/// A job's fields, named.
const JOB_FIELDS: [(&str, JobField); 10] = [
    ("command", |job| lossy(&job.argv)),
    ("environment", |job| lossy(&job.env)),
    ("working directory", |job| {
        lossy(std::slice::from_ref(&job.cwd))
    }),
    ("user", |job| lossy(std::slice::from_ref(&job.user))),
    ("entropy", |job| provm_trace::hex(&job.entropy)),
    ("wall clock", |job| {
        let ns = job.wall_clock_ns;
        format!("{} ({ns} ns)", date_time(ns / 1_000_000_000))
    }),
    ("inputs", |job| lossy(&job.inputs)),
    ("stdin", |job| job.stdin.to_string()),
    ("outputs", |job| lossy(&job.outputs)),
    ("provenance capture", |job| job.provenance.to_string()),
];

fn job_field(job: &Job, name: &str) -> String {
    let (_, of) = JOB_FIELDS
        .iter()
        .find(|(field, _)| *field == name)
        .expect("a field of JOB_FIELDS");
    of(job)
}

fn lossy(items: &[Vec<u8>]) -> String {
    let items: Vec<_> = items.iter().map(|i| String::from_utf8_lossy(i)).collect();
    format!("{items:?}")
}

impl Source {
    /// A short name, for `--json`.
    pub fn name(&self) -> String {
        match self {
            Source::Clock => "clock".into(),
            Source::WallClock => "wall clock".into(),
            Source::DeviceRead => "read result".into(),
            Source::Job(fields) => format!("job: {}", fields.join(", ")),
            Source::InputData => "input data".into(),
            Source::Stdin => "stdin".into(),
            Source::HostMessage => "agent input".into(),
            Source::NetworkReply => "network reply".into(),
            Source::Interrupt => "interrupt".into(),
            Source::Schedule => "vCPU schedule".into(),
            Source::Preemption => "preemption".into(),
            Source::Guest => "not an input".into(),
            Source::End => "end of a log".into(),
        }
    }
}

/// The input in words: what it is, and where runs get it from.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Clock => f.write_str("a clock reading: the guest's monotonic clock, which follows the host's time (a --pinned run's follows the guest's progress)"),
            Source::WallClock => f.write_str("a wall-clock reading: the time of day"),
            Source::DeviceRead => f.write_str("a read result: what a device returned to the guest"),
            Source::Job(fields) => {
                let verb = if fields.len() == 1 { "differs" } else { "differ" };
                write!(f, "the job the host sent the agent: its {} {verb}", fields.join(" and "))?;
                let why: Vec<&str> = fields
                    .iter()
                    .filter_map(|field| match *field {
                        "entropy" => Some("the entropy seeds the guest's random numbers, /dev/urandom and getrandom: record with --pinned and one --seed to fix it"),
                        "wall clock" => Some("the wall clock is the time of day the command starts at: record with --pinned and one --epoch to fix it"),
                        _ => None,
                    })
                    .collect();
                if !why.is_empty() {
                    write!(f, " ({})", why.join("; "))?;
                }
                Ok(())
            }
            Source::InputData => f.write_str("an input file's data (--input)"),
            Source::Stdin => f.write_str("the command's standard input"),
            Source::HostMessage => f.write_str("a message of the host to the agent"),
            Source::NetworkReply => f.write_str("a network reply: a frame the guest's network card received (--net)"),
            Source::Interrupt => f.write_str("an interrupt: where the host delivered one, which follows the host's timing"),
            Source::Schedule => f.write_str("the vCPU schedule: which vCPU ran next"),
            Source::Preemption => f.write_str("a preemption: where the host stopped a guest that computed without exits"),
            Source::Guest => f.write_str("not an input: the guest acted differently with every logged input the same before it, so an input provm does not log differs (`provm inspect` lists this host's holes)"),
            Source::End => f.write_str("the end of one log: the other run went on (a run cut short, or a longer one)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_guest_agent::HostMessage;
    use provm_trace::events::Place;

    const AT: Place = Place {
        rip: 0xffff_ffff_8100_0000,
        registers: 7,
    };

    fn walked(first: Vec<Event>, second: Vec<Event>) -> Walked {
        let mut walker = Walker::default();
        let (mut a, mut b) = (first.into_iter(), second.into_iter());
        loop {
            let events = [a.next(), b.next()];
            if events.iter().all(Option::is_none) {
                return walker.walked();
            }
            walker.step(events);
        }
    }

    fn job(entropy: u8) -> Event {
        let job = Job {
            argv: vec![b"date".to_vec()],
            inputs: vec![b"/in".to_vec()],
            entropy: vec![entropy; 4],
            wall_clock_ns: 946_684_800_000_000_000,
            ..Job::default()
        };
        Event::AgentInput(HostMessage::Run(job).encode())
    }

    fn cmos_read() -> Event {
        Event::PioRead {
            port: 0x71,
            len: 1,
            at: AT,
        }
    }

    #[test]
    fn the_same_logs_do_not_part() {
        let log = vec![cmos_read(), Event::ReadResult(vec![1]), job(1)];
        let walked = walked(log.clone(), log);
        assert_eq!(walked.parting, None);
        assert_eq!(walked.runs[0].events, 3);
        assert_eq!(walked.runs[1].job.as_ref().unwrap().argv, [b"date"]);
    }

    #[test]
    fn a_read_result_is_named_by_the_device_read() {
        let log = |second| vec![cmos_read(), Event::ReadResult(vec![second]), job(1)];
        let parting = walked(log(0x12), log(0x13)).parting.expect("parted");
        assert_eq!(parting.index, 1);
        assert_eq!(parting.source, Source::DeviceRead);
        assert_eq!(parting.device, Some("cmos"));
        assert_eq!(parting.value(0), "read returned 12");
        assert_eq!(parting.value(1), "read returned 13");
    }

    #[test]
    fn a_job_names_the_fields_that_differ() {
        let parting = walked(vec![Event::Clock(5), job(1)], vec![Event::Clock(5), job(2)])
            .parting
            .expect("parted");
        assert_eq!(parting.index, 1);
        assert_eq!(parting.source, Source::Job(vec!["entropy"]));
        assert_eq!(parting.value(0), "entropy 01010101");
        assert_eq!(parting.value(1), "entropy 02020202");
        assert!(
            parting.source.to_string().contains("random"),
            "{}",
            parting.source
        );
    }

    #[test]
    fn an_input_files_data_is_shown_with_its_path() {
        let data = |text: &str| {
            let entry = provm_guest_agent::Entry {
                tree: 0,
                path: b"params.txt".to_vec(),
                content: EntryContent::Data(text.into()),
            };
            Event::AgentInput(HostMessage::Entry(entry).encode())
        };
        let parting = walked(
            vec![job(1), data("3\n1\n2\n")],
            vec![job(1), data("3\n1\n4\n")],
        )
        .parting
        .expect("parted");
        assert_eq!((parting.index, &parting.source), (1, &Source::InputData));
        assert_eq!(parting.value(1), r#"/in/params.txt: "3\n1\n4\n""#);
    }

    #[test]
    fn an_input_against_an_exit_is_the_input_and_an_exit_against_an_exit_is_the_guest() {
        let interrupt = walked(vec![cmos_read()], vec![Event::Inject(0x20)]);
        assert_eq!(interrupt.parting.unwrap().source, Source::Interrupt);
        let serial = Event::PioWrite {
            port: 0x3f8,
            data: vec![b'a'],
            at: AT,
        };
        let guest = walked(vec![cmos_read()], vec![serial]).parting.unwrap();
        assert_eq!((guest.source, guest.device), (Source::Guest, Some("cmos")));
    }

    #[test]
    fn a_shorter_log_parts_where_it_ends() {
        let parting = walked(
            vec![Event::Clock(1)],
            vec![Event::Clock(1), Event::Clock(2)],
        )
        .parting
        .unwrap();
        assert_eq!((parting.index, parting.source.clone()), (1, Source::End));
        assert_eq!(parting.value(0), "its log ends here");
        assert_eq!(parting.value(1), "clock 2 ns");
    }
}
