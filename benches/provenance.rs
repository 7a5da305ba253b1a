//! The cost of provenance capture: a build-like shell workload (many small
//! processes and files) run with capture off and on in one booted guest.
//! Run by benches/bench.sh; prints one table.

// The tests' image builder.
#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use provm::provenance::{self, VmBoundary};
use provm_engine::start::RunOptions;
use provm_guest_agent::{Job, Outcome, ProvRecord};

/// "Compile" 40 sources (sed), checksum each object (md5sum), link
/// (cat), index (sort, wc) and package (tar): about 90 processes, 200 files.
/// `$1` names a fresh directory.
const BUILD: &str = r#"
set -e
mkdir -p "$1" && cd "$1"
for i in $(seq 40); do echo "int f$i(void) { return $i; }" > src$i.c; done
for i in $(seq 40); do
  sed 's/int/long/' src$i.c > obj$i.o
  md5sum obj$i.o > obj$i.sum
done
cat obj*.o > lib.a
sort obj*.sum > all.sum
wc -l all.sum > count
tar cf out.tar lib.a all.sum count
"#;

fn main() {
    let options = RunOptions::new(common::images().tiny_qcow2.clone(), Vec::new());
    let job = |directory: &str, provenance: bool| Job {
        provenance,
        ..common::shell_job(
            &RunOptions {
                command: Vec::new(),
                ..options.clone()
            },
            &format!("set -- {directory}; {BUILD}"),
        )
    };
    let prepared = provm_engine::start::prepare(&options).unwrap();
    let mut guest = common::start_guest(&options, &prepared);
    let mut timed = |job: Job| {
        let start = Instant::now();
        let outcome = guest.run(job, &mut Vec::new(), &mut Vec::new()).unwrap();
        assert_eq!(outcome, Outcome::Exited(0));
        start.elapsed()
    };
    // The first job mounts the root: not part of either measurement.
    timed(common::shell_job(&options, "true"));
    let off = timed(job("/tmp/off", false));
    let on = timed(job("/tmp/on", true));
    let records = guest.take_provenance();
    guest.power_off().unwrap();
    report(off, on, &records);
}

fn report(off: Duration, on: Duration, records: &[ProvRecord]) {
    let count = |wanted: fn(&ProvRecord) -> bool| records.iter().filter(|r| wanted(r)).count();
    let processes = count(|record| matches!(record, ProvRecord::Process(_)));
    let events = count(|record| {
        matches!(
            record,
            ProvRecord::Used { .. }
                | ProvRecord::Generated { .. }
                | ProvRecord::Started { .. }
                | ProvRecord::Derived { .. }
                | ProvRecord::Invalidated { .. }
        )
    });
    let document = provenance::build(records, &VmBoundary::default());
    let stored = document.to_bytes().len();
    let nodes = document.activities.len() + document.entities.len();
    println!("| build-like workload ({processes} processes) | value |");
    println!("|---|---|");
    println!("| capture off | {:.3} s |", off.as_secs_f64());
    println!("| capture on | {:.3} s |", on.as_secs_f64());
    println!(
        "| overhead (on / off) | {:.2} ({:+.1} %) |",
        on.as_secs_f64() / off.as_secs_f64(),
        (on.as_secs_f64() / off.as_secs_f64() - 1.0) * 100.0
    );
    println!(
        "| recorded events (use, generation, start, ...) | {events} ({:.0} per second of the captured run) |",
        events as f64 / on.as_secs_f64()
    );
    println!(
        "| graph size per process | {:.1} nodes, {:.1} relations, {:.0} bytes stored |",
        nodes as f64 / processes as f64,
        document.relations.len() as f64 / processes as f64,
        stored as f64 / processes as f64
    );
}
