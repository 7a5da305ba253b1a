//! `manifest`: one row per run, what was run where and how it ended (the
//! trace's manifest and outcome).

use super::Kind::{Boolean, Integer, Real, Text, UnixSeconds};
use super::{column, Rows, Table};
use crate::query::{QueryError, Run};

pub const MANIFEST: Table = Table {
    name: "manifest",
    doc: "one row per run: what ran, where, and how it ended",
    columns: &[
        column("argv", Text, "the command, a JSON array"),
        column("env", Text, "the command's whole environment, a JSON array"),
        column("cwd", Text, "its working directory in the guest"),
        column(
            "image",
            Text,
            "the disk image's file name (its path with --keep-host-paths)",
        ),
        column("image_sha256", Text, "the image file's SHA-256"),
        column("kernel_sha256", Text, "the guest kernel's SHA-256"),
        column("memory_mib", Integer, "guest memory"),
        column(
            "started_unix",
            UnixSeconds,
            "when the recording started, seconds since the epoch",
        ),
        column("provm_version", Text, "the provm that recorded it"),
        column("host_cpu", Text, "the host's CPU model"),
        column("hypervisor", Text, "the host's KVM"),
        column(
            "complete",
            Boolean,
            "1 if the run ended normally, 0 if it was cut short",
        ),
        column("ended", Text, "what ended it, in words"),
        column(
            "exit_status",
            Integer,
            "the command's exit status, as a shell reports it",
        ),
        column("events", Integer, "events in the log"),
        column("exits", Integer, "VM exits in the log"),
        column(
            "guest_ns",
            Integer,
            "virtual time from the snapshot to the end",
        ),
        column("host_seconds", Real, "host time the recording took"),
        column("disk_writes", Integer, "disk writes"),
        column("trace_bytes", Integer, "the trace file's size"),
        column(
            "has_provenance",
            Boolean,
            "1 if recorded with --prov (processes, files and edges are filled)",
        ),
        column(
            "has_timing",
            Boolean,
            "1 if the trace keeps exit timing (the blame tables are filled)",
        ),
    ],
    indexes: &[],
    fill,
    from_replay: false,
};

fn fill(run: &Run, rows: &mut Rows<'_>) -> Result<(), QueryError> {
    let (m, o) = (&run.trace.manifest, &run.trace.outcome);
    let json = |items: &[String]| serde_json::to_string(items).expect("strings serialise");
    let image_sha256 = m.image.chain.first().map(|file| file.sha256.as_str());
    let trace_bytes = std::fs::metadata(&run.trace.path)?.len() as i64;
    rows.insert(&[
        &json(&m.argv),
        &json(&m.env),
        &m.cwd,
        &m.image.path,
        &image_sha256,
        &m.kernel_sha256,
        &(m.memory_mib as i64),
        &(m.started_unix as i64),
        &m.provm_version,
        &m.host.cpu,
        &m.host.hypervisor,
        &o.complete,
        &o.ended,
        &o.exit_status,
        &(o.events as i64),
        &(o.exits as i64),
        &(o.guest_ns as i64),
        &o.host_seconds,
        &(o.disk_writes as i64),
        &trace_bytes,
        &run.provenance.is_some(),
        &run.trace.timing.is_some(),
    ])
}
