//! `provm export timeline`: the run in the Trace Event Format, the JSON
//! that Perfetto and chrome://tracing open: a `traceEvents` array of
//! events, each with a phase `ph`, a time `ts` in microseconds, a process
//! `pid` and a thread `tid`.
//!
//! - pid 1, "guest processes": one thread per guest process (its tid the
//!   guest's pid) holding each program it ran as a complete event (`X`,
//!   with `dur`), from the provenance graph when the run has one;
//! - pid 2, "VMM": the run itself as a complete event, and counters (`C`)
//!   of the VM exits by device, the interrupts injected and the bytes
//!   written to disk in every 10 ms of guest time, and, when the trace
//!   keeps exit timing, a counter of the VMM's time by device (see
//!   `blame_counter`);
//! - with more than one vCPU, a thread per vCPU on pid 2 holding each
//!   stretch it ran as a complete event, from the log's switches (see
//!   `VcpuStretches`);
//! - names for both processes and every thread as metadata events (`M`);
//! - with a replay (`--with-replay`), every system call as a complete event
//!   on its thread (tid the guest's thread id), nested in its process's
//!   program, and the processes from the replay when the run has no
//!   provenance graph (their times then on the monotonic clock already).
//!
//! Times are the guest's monotonic clock, the one the event log reads. The
//! processes' times are the guest's wall clock, which the agent set from
//! the job's clock when the command started: a process's place on the
//! monotonic clock is its wall time less the job's, plus the first clock
//! reading after the job arrived.

use std::collections::BTreeMap;
use std::path::Path;

use provm_guest_agent::{FrameReader, HostMessage};
use provm_trace::events::Event;
use provm_vmm::vm::{mmio_device, port_device};
use serde_json::{json, Value};

use super::ExportError;
use crate::analyses::processes::ProcessTree;
use crate::analyses::syscalls::SyscallLog;
use crate::output::AtomicFile;
use crate::provenance::{Provenance, VM_ACTIVITY};
use crate::query::Run;
use provm_engine::replay::{self, ReplayOptions};
use provm_engine::timing::TimingReport;

const GUEST_PID: u32 = 1;
const VMM_PID: u32 = 2;
/// The VMM's thread holding the run as a whole.
const RUN_TID: u32 = 1;
/// vCPU N's thread on the VMM's process: after the run's.
const FIRST_VCPU_TID: u32 = 100;
/// Counters sum what happened in each slice of guest time this long.
const BUCKET_NS: u64 = 10_000_000;

/// Writes the timeline of `run` to `path`, with what a replay of it shows
/// `with_replay`; says whether it has process tracks (not without
/// provenance or a replay).
pub fn timeline(
    run: &Run,
    path: &Path,
    force: bool,
    with_replay: bool,
) -> Result<bool, ExportError> {
    let mut file = AtomicFile::create(path, force)?;
    let document = document(run, with_replay)?;
    let has_processes = run.provenance.is_some() || with_replay;
    serde_json::to_writer(std::io::BufWriter::new(file.file()), &document).map_err(|error| {
        ExportError::Io {
            path: path.to_owned(),
            source: error.into(),
        }
    })?;
    file.commit()?;
    Ok(has_processes)
}

/// The timeline as a JSON document.
fn document(run: &Run, with_replay: bool) -> Result<Value, ExportError> {
    let mut events = vec![
        process_name(GUEST_PID, "guest processes"),
        process_name(VMM_PID, "VMM"),
        thread_name(VMM_PID, RUN_TID, "run"),
    ];
    let vmm = vmm_events(run)?;
    events.push(json!({
        "ph": "X", "pid": VMM_PID, "tid": RUN_TID,
        "name": run.trace.manifest.argv.join(" "),
        "ts": micros(vmm.start_ns), "dur": micros(vmm.end_ns.saturating_sub(vmm.start_ns)),
        "args": { "ended": run.trace.outcome.ended, "exits": run.trace.outcome.exits },
    }));
    if let (Some(graph), Some(job_wall_ns)) = (&run.provenance, vmm.job_wall_ns) {
        let to_guest = |wall_ns: u64| (wall_ns + vmm.start_ns).saturating_sub(job_wall_ns);
        events.extend(process_events(graph, to_guest));
    }
    if with_replay {
        events.extend(replayed_events(run)?);
    }
    if let Some(timing) = run.timing()? {
        events.extend(blame_counter(&timing, &vmm));
    }
    events.extend(vmm.vcpus.events());
    events.extend(vmm.counters);
    Ok(json!({ "traceEvents": events, "displayTimeUnit": "ms" }))
}

fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn process_name(pid: u32, name: &str) -> Value {
    json!({ "ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": { "name": name } })
}

fn thread_name(pid: u32, tid: u32, name: &str) -> Value {
    json!({ "ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": { "name": name } })
}

/// One thread per guest process, named after its first program, and one
/// complete event per program it ran.
fn process_events(graph: &Provenance, to_guest: impl Fn(u64) -> u64) -> Vec<Value> {
    let mut events = Vec::new();
    let mut named = std::collections::HashSet::new();
    for process in graph.activities.iter().filter(|a| a.id != VM_ACTIVITY) {
        let label = process.label();
        if named.insert(process.pid) {
            events.push(thread_name(
                GUEST_PID,
                process.pid,
                &format!("{} {}", process.pid, label),
            ));
        }
        let (start, end) = (to_guest(process.start_ns), to_guest(process.end_ns));
        events.push(json!({
            "ph": "X", "pid": GUEST_PID, "tid": process.pid, "name": label,
            "ts": micros(start), "dur": micros(end.saturating_sub(start)),
            "args": { "id": process.id, "exe": process.exe, "outcome": process.outcome },
        }));
    }
    events
}

/// What a replay of `run` with the `syscalls` and `processes` analyses
/// shows: every system call on its thread, and each process's life when
/// the run has no provenance graph to draw them from.
fn replayed_events(run: &Run) -> Result<Vec<Value>, ExportError> {
    eprintln!("provm: replaying {} for its system calls", run.name);
    let options = ReplayOptions::for_analysis(run.trace.path.clone());
    let analyses: Vec<Box<dyn provm_analysis::Analysis>> = vec![
        Box::new(SyscallLog::default()),
        Box::new(ProcessTree::default()),
    ];
    let (report, analyses) =
        replay::replay(&options, analyses).map_err(|e| ExportError::Replay(e.to_string()))?;
    report.analysable().map_err(ExportError::Replay)?;
    let mut analyses = analyses.into_iter();
    let log: SyscallLog = replay::downcast(analyses.next().unwrap());
    let tree: ProcessTree = replay::downcast(analyses.next().unwrap());
    let mut events = Vec::new();
    if run.provenance.is_none() {
        for process in tree.processes.values() {
            let program = process
                .execs
                .last()
                .map_or(process.comm.clone(), |(_, argv)| argv.join(" "));
            let tid = process.pid as u32;
            events.push(thread_name(
                GUEST_PID,
                tid,
                &format!("{} {program}", process.pid),
            ));
            let (Some(start), Some(end)) = (process.start_ns, process.end_ns) else {
                continue;
            };
            events.push(json!({
                "ph": "X", "pid": GUEST_PID, "tid": tid, "name": program,
                "ts": micros(start), "dur": micros(end.saturating_sub(start)),
                "args": { "status": process.status },
            }));
        }
    }
    for call in &log.calls {
        events.push(json!({
            "ph": "X", "pid": GUEST_PID, "tid": call.task.tid as u32, "name": call.name,
            "ts": micros(call.entry_ns), "dur": micros(call.exit_ns.saturating_sub(call.entry_ns)),
            "args": { "call": call.to_string(), "comm": call.task.comm },
        }));
    }
    Ok(events)
}

/// What the event log gives the timeline.
struct VmmEvents {
    /// The first and last clock readings.
    start_ns: u64,
    end_ns: u64,
    /// The wall clock the job set, from the host's message to the agent.
    job_wall_ns: Option<u64>,
    counters: Vec<Value>,
    vcpus: VcpuStretches,
    /// The log's VM exits per bucket of guest time, by device (or exit
    /// reason, as the exit timing names them).
    exits: BTreeMap<u64, BTreeMap<&'static str, u64>>,
}

fn vmm_events(run: &Run) -> Result<VmmEvents, ExportError> {
    let mut log = run.trace.events()?;
    let mut agent_input = FrameReader::default();
    let (mut start_ns, mut now_ns, mut job_wall_ns) = (None, 0, None);
    let mut counters = Counters::default();
    let mut vcpus = VcpuStretches::starting_on(run.first_vcpu()?);
    let mut exits: BTreeMap<u64, BTreeMap<&'static str, u64>> = BTreeMap::new();
    while let Some(event) = log.next_event()? {
        let device = match &event {
            Event::Clock(ns) => {
                now_ns = *ns;
                start_ns.get_or_insert(*ns);
                None
            }
            Event::AgentInput(bytes) if job_wall_ns.is_none() => {
                agent_input.push(bytes);
                job_wall_ns = job_clock(&mut agent_input);
                None
            }
            Event::PioRead { port, .. } | Event::PioWrite { port, .. } => Some(port_device(*port)),
            Event::MmioRead { address, .. } | Event::MmioWrite { address, .. } => {
                Some(mmio_device(*address))
            }
            Event::Inject(_) => {
                counters.add(now_ns, "interrupts injected", "interrupts", 1);
                None
            }
            Event::DiskWrite { len, .. } => {
                counters.add(now_ns, "disk writes", "bytes", u64::from(*len));
                None
            }
            Event::Switch(to) => {
                vcpus.switch(*to, start_ns.unwrap_or(now_ns), now_ns);
                None
            }
            _ => None,
        };
        if let Some(device) = device {
            counters.add(now_ns, "VM exits by device", device, 1);
        }
        let exit = device.or(match event {
            Event::Halt { .. } => Some("halt"),
            Event::MsrRead { .. } => Some("msr"),
            Event::InterruptWindow { .. } => Some("interrupt-window"),
            _ => None,
        });
        if let Some(exit) = exit {
            *exits
                .entry(now_ns / BUCKET_NS)
                .or_default()
                .entry(exit)
                .or_default() += 1;
        }
    }
    Ok(VmmEvents {
        start_ns: start_ns.unwrap_or(0),
        end_ns: now_ns,
        job_wall_ns,
        counters: counters.finish(),
        vcpus: vcpus.finish(now_ns),
        exits,
    })
}

const BLAME_COUNTER: &str = "VMM time by device (ns, cumulative, spread over its exits)";

/// The VMM's time by device as a cumulative counter. The timing section
/// holds each device's total over the run, not each exit's cost, so the
/// total is spread over the device's exits in the log, an equal share each
/// (its mean): the shape of the curve is where the exits fell, its value
/// at the run's end the measured total. A device whose exits the log does
/// not hold (a halt the recorder did not log) reaches its total at the end.
fn blame_counter(timing: &TimingReport, vmm: &VmmEvents) -> Vec<Value> {
    let by_device = timing.by_device();
    let totals: BTreeMap<&str, u64> = by_device
        .iter()
        .map(|(device, d)| (device.as_str(), d.times.vmm_ns))
        .collect();
    let mut logged: BTreeMap<&str, u64> = BTreeMap::new();
    for (device, n) in vmm.exits.values().flatten() {
        *logged.entry(device).or_default() += n;
    }
    let sample = |at_ns: u64, args: BTreeMap<&str, u64>| {
        json!({ "ph": "C", "pid": VMM_PID, "tid": 0, "name": BLAME_COUNTER,
                "ts": micros(at_ns), "args": args })
    };
    let spread = |seen: &BTreeMap<&str, u64>| -> BTreeMap<&str, u64> {
        totals
            .iter()
            .map(|(&device, &total)| {
                let share = match (seen.get(device), logged.get(device)) {
                    (Some(&n), Some(&all)) => {
                        (u128::from(total) * u128::from(n) / u128::from(all)) as u64
                    }
                    _ => 0,
                };
                (device, share)
            })
            .collect()
    };
    let mut seen = BTreeMap::new();
    let mut samples = vec![sample(vmm.start_ns, spread(&seen))];
    for (bucket, exits) in &vmm.exits {
        for (device, n) in exits {
            *seen.entry(*device).or_default() += n;
        }
        // At the bucket's end: by then its exits were handled.
        let at_ns = ((bucket + 1) * BUCKET_NS).max(vmm.start_ns);
        if at_ns < vmm.end_ns {
            samples.push(sample(at_ns, spread(&seen)));
        }
    }
    samples.push(sample(vmm.end_ns, totals));
    samples
}

/// The wall clock of the first job in the agent's input so far, if a whole
/// job message has arrived.
fn job_clock(input: &mut FrameReader) -> Option<u64> {
    while let Ok(Some((kind, payload))) = input.next_frame() {
        if let Ok(HostMessage::Run(job)) = HostMessage::decode(kind, &payload) {
            return Some(job.wall_clock_ns);
        }
    }
    None
}

/// Which vCPU ran when, from the log's switches: the vCPU the snapshot
/// was taken on runs until the first (as in `provm query`'s `cpu` column). A stretch's times are the
/// clock readings last logged before its switches, so stretches with no
/// reading between them have no length; a log without switches (one vCPU)
/// gives no tracks.
struct VcpuStretches {
    /// The vCPU that runs until the first switch.
    first: u8,
    /// The running vCPU and when it started, after the first switch.
    running: Option<(u8, u64)>,
    /// (vCPU, start, end) in nanoseconds of guest time.
    stretches: Vec<(u8, u64, u64)>,
}

impl VcpuStretches {
    fn starting_on(first: u8) -> Self {
        VcpuStretches {
            first,
            running: None,
            stretches: Vec::new(),
        }
    }

    /// A switch to `to` at `now_ns`; `start_ns` is the log's first reading.
    fn switch(&mut self, to: u8, start_ns: u64, now_ns: u64) {
        let (from, since) = self.running.unwrap_or((self.first, start_ns));
        if from != to {
            self.stretches.push((from, since, now_ns));
            self.running = Some((to, now_ns));
        }
    }

    fn finish(mut self, end_ns: u64) -> Self {
        if let Some((cpu, since)) = self.running.take() {
            self.stretches.push((cpu, since, end_ns));
        }
        self
    }

    /// A named thread per vCPU and a complete event per stretch.
    fn events(&self) -> Vec<Value> {
        let tid = |cpu: u8| FIRST_VCPU_TID + u32::from(cpu);
        let cpus: std::collections::BTreeSet<u8> =
            self.stretches.iter().map(|&(cpu, ..)| cpu).collect();
        let names = cpus
            .into_iter()
            .map(|cpu| thread_name(VMM_PID, tid(cpu), &format!("vCPU {cpu}")));
        let stretches = self.stretches.iter().map(|&(cpu, start, end)| {
            json!({
                "ph": "X", "pid": VMM_PID, "tid": tid(cpu), "name": format!("vCPU {cpu} runs"),
                "ts": micros(start), "dur": micros(end.saturating_sub(start)),
            })
        });
        names.chain(stretches).collect()
    }
}

/// Counter events: per counter, the sum of each series in every bucket of
/// guest time that has any, and a zero after a bucket that the next one
/// does not follow, so that a viewer does not draw a value through a quiet
/// stretch.
#[derive(Default)]
struct Counters {
    /// Per counter name: the bucket being summed, its series, and the
    /// samples so far.
    open: BTreeMap<&'static str, (u64, BTreeMap<&'static str, u64>)>,
    samples: Vec<Value>,
}

impl Counters {
    fn add(&mut self, now_ns: u64, counter: &'static str, series: &'static str, amount: u64) {
        let bucket = now_ns / BUCKET_NS;
        let (open_bucket, sums) = self
            .open
            .entry(counter)
            .or_insert((bucket, BTreeMap::new()));
        if *open_bucket != bucket {
            let previous = std::mem::take(sums);
            self.samples
                .extend(samples(counter, *open_bucket, previous, bucket));
            *open_bucket = bucket;
        }
        *sums.entry(series).or_default() += amount;
    }

    fn finish(mut self) -> Vec<Value> {
        for (counter, (bucket, sums)) in std::mem::take(&mut self.open) {
            self.samples
                .extend(samples(counter, bucket, sums, bucket + 2));
        }
        self.samples
    }
}

/// The sample of `bucket`, and a zero sample after it unless `next` follows
/// it directly.
fn samples(counter: &str, bucket: u64, sums: BTreeMap<&str, u64>, next: u64) -> Vec<Value> {
    let sample = |bucket: u64, args: Value| {
        json!({ "ph": "C", "pid": VMM_PID, "tid": 0, "name": counter,
                "ts": micros(bucket * BUCKET_NS), "args": args })
    };
    let zeros: BTreeMap<&str, u64> = sums.keys().map(|series| (*series, 0)).collect();
    let mut out = vec![sample(bucket, json!(sums))];
    if next > bucket + 1 {
        out.push(sample(bucket + 1, json!(zeros)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provenance::Activity;

    #[test]
    fn counters_sum_per_bucket_and_drop_to_zero_in_gaps() {
        let mut counters = Counters::default();
        counters.add(1_000, "exits", "pic", 1);
        counters.add(2_000, "exits", "pic", 1);
        counters.add(3_000, "exits", "serial", 1);
        counters.add(BUCKET_NS + 5, "exits", "pic", 1);
        counters.add(5 * BUCKET_NS, "exits", "pic", 1);
        let samples = counters.finish();
        let shown: Vec<(f64, String)> = samples
            .iter()
            .map(|s| (s["ts"].as_f64().unwrap(), s["args"].to_string()))
            .collect();
        let at = |bucket: u64| micros(bucket * BUCKET_NS);
        assert_eq!(
            shown,
            [
                (at(0), r#"{"pic":2,"serial":1}"#.into()),
                (at(1), r#"{"pic":1}"#.into()),
                (at(2), r#"{"pic":0}"#.into()),
                (at(5), r#"{"pic":1}"#.into()),
                (at(6), r#"{"pic":0}"#.into()),
            ]
        );
        assert!(samples
            .iter()
            .all(|s| s["ph"] == "C" && s["pid"] == VMM_PID));
    }

    #[test]
    fn vmm_time_is_spread_over_the_logged_exits_and_ends_at_the_total() {
        use provm_engine::timing::report::{DeviceTiming, ProcessTiming, Times};
        let device = |exits, vmm_ns| DeviceTiming {
            exits,
            times: Times {
                vmm_ns,
                ..Times::default()
            },
            latency: Vec::new(),
        };
        let process = |pid, devices: Vec<(&str, DeviceTiming)>| ProcessTiming {
            pid,
            comm: "p".into(),
            devices: devices.into_iter().map(|(n, d)| (n.into(), d)).collect(),
        };
        let timing = TimingReport {
            format: provm_engine::timing::report::TIMING_FORMAT,
            mode: "record".into(),
            injected: None,
            preemption_measured: true,
            capture_ns: 0,
            processes: vec![
                process(1, vec![("pic", device(3, 300)), ("msr", device(1, 50))]),
                process(2, vec![("pic", device(1, 100))]),
            ],
            vcpus: Vec::new(),
        };
        // pic: one exit in bucket 0, three in bucket 2; msr is not logged.
        let vmm = VmmEvents {
            start_ns: 5,
            end_ns: 3 * BUCKET_NS + 7,
            job_wall_ns: None,
            counters: Vec::new(),
            vcpus: VcpuStretches::starting_on(0),
            exits: BTreeMap::from([
                (0, BTreeMap::from([("pic", 1)])),
                (2, BTreeMap::from([("pic", 3)])),
            ]),
        };
        let shown: Vec<(f64, String)> = blame_counter(&timing, &vmm)
            .iter()
            .map(|s| (s["ts"].as_f64().unwrap(), s["args"].to_string()))
            .collect();
        assert_eq!(
            shown,
            [
                (micros(5), r#"{"msr":0,"pic":0}"#.into()),
                (micros(BUCKET_NS), r#"{"msr":0,"pic":100}"#.into()),
                (micros(3 * BUCKET_NS), r#"{"msr":0,"pic":400}"#.into()),
                (micros(3 * BUCKET_NS + 7), r#"{"msr":50,"pic":400}"#.into()),
            ]
        );
    }

    #[test]
    fn each_vcpu_is_a_thread_of_the_stretches_it_ran() {
        let mut vcpus = VcpuStretches::starting_on(0);
        vcpus.switch(1, 10, 50);
        vcpus.switch(1, 10, 60);
        vcpus.switch(0, 10, 70);
        let events = vcpus.finish(90).events();
        let shown: Vec<(String, u64, f64, f64)> = events
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                let at = |field: &str| e[field].as_f64().unwrap();
                (
                    e["name"].to_string(),
                    e["tid"].as_u64().unwrap(),
                    at("ts"),
                    at("dur"),
                )
            })
            .collect();
        let stretch = |cpu: u8, start, end| {
            let name = format!("\"vCPU {cpu} runs\"");
            let tid = u64::from(FIRST_VCPU_TID + u32::from(cpu));
            (name, tid, micros(start), micros(end - start))
        };
        assert_eq!(
            shown,
            [stretch(0, 10, 50), stretch(1, 50, 70), stretch(0, 70, 90)],
            "a switch to the running vCPU starts no stretch"
        );
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["vCPU 0", "vCPU 1"]);
        assert!(
            VcpuStretches::starting_on(0).finish(90).events().is_empty(),
            "one vCPU: no tracks"
        );
    }

    /// A booted guest's snapshot may have been taken on vCPU 1: its log's
    /// first switch, to vCPU 0, ends vCPU 1's first stretch.
    #[test]
    fn the_first_stretch_is_the_snapshots_vcpus() {
        let mut vcpus = VcpuStretches::starting_on(1);
        vcpus.switch(0, 10, 50);
        let stretches = vcpus.finish(90).stretches;
        assert_eq!(stretches, [(1, 10, 50), (0, 50, 90)]);
    }

    #[test]
    fn processes_are_threads_on_the_guest_clock() {
        let activity = |id: &str, pid, argv: &[&str], start_ns, end_ns| Activity {
            id: id.into(),
            pid,
            exe: "/bin/busybox".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            start_ns,
            end_ns,
            outcome: None,
        };
        let graph = Provenance {
            activities: vec![
                activity(VM_ACTIVITY, 0, &[], 0, 0),
                activity("process/0", 7, &["sh", "-c", "x"], 5_000, 9_000),
                activity("process/1", 7, &["wc"], 9_000, 10_000),
            ],
            ..Provenance::default()
        };
        let events = process_events(&graph, |wall| wall - 1_000);
        let phases: Vec<&str> = events.iter().map(|e| e["ph"].as_str().unwrap()).collect();
        assert_eq!(phases, ["M", "X", "X"], "one thread per pid");
        assert_eq!(events[0]["args"]["name"], "7 sh -c x");
        assert_eq!(
            (events[1]["ts"].as_f64(), events[1]["dur"].as_f64()),
            (Some(4.0), Some(4.0))
        );
        assert_eq!(events[2]["name"], "wc");
    }
}
