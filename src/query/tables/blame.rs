//! `blame` and `blame_devices`: the trace's exit timing (`provm blame`),
//! per guest process and per process and device; `blame_vcpus`: per vCPU
//! and device. Empty for a trace without
//! a timing section (`--no-timing`, an older provm; `manifest.has_timing`
//! tells them apart).

use super::Kind::{Integer, Text};
use super::{column, Rows, Table};
use crate::blame::table::Row;
use crate::query::{QueryError, Run};
use provm_engine::timing::report::QUANTILES;

pub const BLAME: Table = Table {
    name: "blame",
    doc: "one row per guest process in the exit timing: where its host time went (provm blame)",
    columns: &[
        column(
            "pid",
            Integer,
            "the process (thread group) id; 0 the idle task, -1 not readable",
        ),
        column(
            "command",
            Text,
            "its name, the kernel's comm (15 bytes at most)",
        ),
        column("wall_ns", Integer, "guest + vmm + recorder + halted"),
        column("guest_ns", Integer, "host ns in the guest (KVM_RUN)"),
        column(
            "vmm_ns",
            Integer,
            "host ns in the VMM handling its exits, all devices (injected delay included)",
        ),
        column(
            "halted_ns",
            Integer,
            "host ns halted after its exits, waiting for a tick",
        ),
        column(
            "preempted_ns",
            Integer,
            "host preemption of the vCPU thread, sampled, part of the others (0 without schedstat)",
        ),
        column(
            "recorder_ns",
            Integer,
            "host ns the recorder spent logging its exits",
        ),
        column(
            "injected_ns",
            Integer,
            "of vmm_ns, delay injected on purpose",
        ),
        column("exits", Integer, "its VM exits, all devices"),
    ],
    indexes: &["pid"],
    fill: fill_processes,
    from_replay: false,
};

pub const BLAME_DEVICES: Table = Table {
    name: "blame_devices",
    doc:
        "one row per guest process and device (or exit reason) it exited for, from the exit timing",
    columns: &[
        column("pid", Integer, "the process, as in blame"),
        column("command", Text, "its name, as in blame"),
        column(
            "device",
            Text,
            "a device as in events, or the exit's reason: halt, msr, interrupt-window",
        ),
        column("exits", Integer, "the process's VM exits for it"),
        column("guest_ns", Integer, "host ns in the guest before them"),
        column("vmm_ns", Integer, "host ns in the VMM handling them"),
        column("halted_ns", Integer, "host ns halted after them"),
        column(
            "preempted_ns",
            Integer,
            "host preemption, sampled, part of the others",
        ),
        column("recorder_ns", Integer, "host ns logging them"),
        column("injected_ns", Integer, "of vmm_ns, delay injected"),
        column(
            "p50_ns",
            Integer,
            "median exit latency (vmm + recorder), as its histogram bucket's upper bound",
        ),
        column("p90_ns", Integer, "90th percentile, likewise"),
        column("p99_ns", Integer, "99th percentile, likewise"),
        column(
            "latency",
            Text,
            "exits per latency bucket, a JSON array: bucket i below 2^i µs (the last: the rest)",
        ),
    ],
    indexes: &["pid", "device"],
    fill: fill_devices,
    from_replay: false,
};

pub const BLAME_VCPUS: Table = Table {
    name: "blame_vcpus",
    doc: "one row per vCPU and device (or exit reason) it exited for, from the exit timing",
    columns: &[
        column("cpu", Integer, "the vCPU, from 0"),
        column("device", Text, "as in blame_devices"),
        column("exits", Integer, "the vCPU's VM exits for it"),
        column("guest_ns", Integer, "host ns in the guest before them"),
        column("vmm_ns", Integer, "host ns in the VMM handling them"),
        column("halted_ns", Integer, "host ns halted after them"),
        column(
            "preempted_ns",
            Integer,
            "host preemption, sampled, part of the others",
        ),
        column("recorder_ns", Integer, "host ns logging them"),
        column("injected_ns", Integer, "of vmm_ns, delay injected"),
    ],
    indexes: &["cpu"],
    fill: fill_vcpus,
    from_replay: false,
};

/// SQLite's integers are i64; host nanoseconds of one run stay below 2^63.
fn int(value: u64) -> i64 {
    value as i64
}

fn fill_processes(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let Some(timing) = run.timing()? else {
        return Ok(());
    };
    for process in &timing.processes {
        // `provm blame`'s own row, so that the table and the command agree.
        let row = Row::process(process);
        rows.insert(&[
            &row.pid,
            &row.command,
            &int(row.wall_ns),
            &int(row.guest_ns),
            &int(row.vmm_total_ns()),
            &int(row.halted_ns),
            &int(row.preempted_ns),
            &int(row.recorder_ns),
            &int(row.injected_ns),
            &int(row.exits.values().sum()),
        ])?;
    }
    Ok(())
}

fn fill_devices(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let Some(timing) = run.timing()? else {
        return Ok(());
    };
    for process in &timing.processes {
        for (device, d) in &process.devices {
            let times = &d.times;
            let [p50, p90, p99] = QUANTILES.map(|q| d.latency_quantile_ns(q).map(int));
            let latency = serde_json::to_string(&d.latency).expect("counts serialise");
            rows.insert(&[
                &process.pid,
                &process.comm,
                device,
                &int(d.exits),
                &int(times.guest_ns),
                &int(times.vmm_ns),
                &int(times.halted_ns),
                &int(times.preempted_ns),
                &int(times.logging_ns),
                &int(times.injected_ns),
                &p50,
                &p90,
                &p99,
                &latency,
            ])?;
        }
    }
    Ok(())
}

/// Empty for a timing from before the per-vCPU sums.
fn fill_vcpus(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let Some(timing) = run.timing()? else {
        return Ok(());
    };
    for (cpu, devices) in timing.vcpus.iter().enumerate() {
        for (device, d) in devices {
            let times = &d.times;
            rows.insert(&[
                &(cpu as i64),
                device,
                &int(d.exits),
                &int(times.guest_ns),
                &int(times.vmm_ns),
                &int(times.halted_ns),
                &int(times.preempted_ns),
                &int(times.logging_ns),
                &int(times.injected_ns),
            ])?;
        }
    }
    Ok(())
}
