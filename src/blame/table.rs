//! `provm blame RUN`: the table of where each guest process's time went, as
//! text, CSV or JSON.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use provm_engine::timing::report::{DeviceTiming, ProcessTiming, TimingReport};

/// What the numbers are, said with every output.
pub const MEASURED: &str = "measured on the host clock at every VM exit: time in the guest (KVM_RUN), in the VMM handling each exit by device, halted waiting for a tick, in the recorder's logging; injected delay is part of the VMM's time";
pub const ESTIMATED: &str = "estimated: the process a span belongs to is the one running at the exit that ends it (guest context switches between exits are not seen); host preemption is the vCPU thread's run delay (schedstat) sampled every 10 ms and is part of the other times, not added to them";

/// One process (or the whole run) in the table. Times in nanoseconds.
#[derive(Debug, Serialize)]
pub struct Row {
    pub pid: Option<i32>,
    pub command: String,
    pub wall_ns: u64,
    pub guest_ns: u64,
    /// The VMM's handling time, by device.
    pub vmm_ns: BTreeMap<String, u64>,
    pub halted_ns: u64,
    pub preempted_ns: u64,
    pub recorder_ns: u64,
    pub injected_ns: u64,
    pub exits: BTreeMap<String, u64>,
}

impl Row {
    fn of(pid: Option<i32>, command: String, devices: &BTreeMap<String, DeviceTiming>) -> Row {
        let mut total = DeviceTiming::default();
        for device in devices.values() {
            total.add(device);
        }
        Row {
            pid,
            command,
            wall_ns: total.total_ns(),
            guest_ns: total.times.guest_ns,
            vmm_ns: devices
                .iter()
                .map(|(name, d)| (name.clone(), d.times.vmm_ns))
                .collect(),
            halted_ns: total.times.halted_ns,
            preempted_ns: total.times.preempted_ns,
            recorder_ns: total.times.logging_ns,
            injected_ns: total.times.injected_ns,
            exits: devices
                .iter()
                .map(|(name, d)| (name.clone(), d.exits))
                .collect(),
        }
    }

    pub fn process(process: &ProcessTiming) -> Row {
        Row::of(Some(process.pid), process.comm.clone(), &process.devices)
    }

    /// The VMM's time over all devices.
    pub fn vmm_total_ns(&self) -> u64 {
        self.vmm_ns.values().sum()
    }
}

/// The processes, longest first, and the run's totals.
pub fn rows(report: &TimingReport) -> (Vec<Row>, Row) {
    let mut rows: Vec<Row> = report.processes.iter().map(Row::process).collect();
    rows.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then(a.pid.cmp(&b.pid)));
    (rows, Row::of(None, "(all)".into(), &report.by_device()))
}

/// With more than one vCPU, a row for each: the same time split by the
/// vCPU that ran, not by process. None with one (its row is the total).
pub fn vcpu_rows(report: &TimingReport) -> Vec<Row> {
    if report.vcpus.len() < 2 {
        return Vec::new();
    }
    report
        .vcpus
        .iter()
        .enumerate()
        .map(|(vcpu, devices)| Row::of(None, format!("(vCPU {vcpu})"), devices))
        .collect()
}

/// Every row in the order the text and CSV show them: the processes, the
/// vCPUs, the total.
fn shown_rows(report: &TimingReport) -> Vec<Row> {
    let (mut shown, total) = rows(report);
    shown.extend(vcpu_rows(report));
    shown.push(total);
    shown
}

/// The devices that had exits, in name order.
fn devices(report: &TimingReport) -> Vec<String> {
    report.by_device().into_keys().collect()
}

pub fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

pub fn write_text(report: &TimingReport, out: &mut dyn Write) -> io::Result<()> {
    let rows = shown_rows(report);
    let devices = devices(report);
    writeln!(
        out,
        "hypervisor blame ({}{}), times in ms",
        report.mode,
        report
            .injected
            .as_ref()
            .map(|delay| format!(", injected {delay}"))
            .unwrap_or_default()
    )?;
    let mut header = vec![
        "pid".to_owned(),
        "command".into(),
        "wall".into(),
        "guest".into(),
    ];
    header.extend(devices.iter().map(|d| format!("vmm:{d}")));
    header.extend(["halted", "preempted", "recorder", "injected"].map(String::from));
    header.extend(devices.iter().map(|d| format!("exits:{d}")));
    let mut lines = vec![header];
    for row in &rows {
        let mut line = vec![
            row.pid.map_or("-".into(), |pid| pid.to_string()),
            row.command.clone(),
            ms(row.wall_ns),
            ms(row.guest_ns),
        ];
        line.extend(
            devices
                .iter()
                .map(|d| ms(row.vmm_ns.get(d).copied().unwrap_or(0))),
        );
        line.extend(
            [
                row.halted_ns,
                row.preempted_ns,
                row.recorder_ns,
                row.injected_ns,
            ]
            .map(ms),
        );
        line.extend(
            devices
                .iter()
                .map(|d| row.exits.get(d).copied().unwrap_or(0).to_string()),
        );
        lines.push(line);
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|column| lines.iter().map(|l| l[column].len()).max().unwrap_or(0))
        .collect();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(column, (cell, width))| match column {
                1 => format!("{cell:<width$}"),
                _ => format!("{cell:>width$}"),
            })
            .collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    writeln!(out, "{MEASURED};")?;
    writeln!(out, "{ESTIMATED}.")?;
    if !report.preemption_measured {
        writeln!(out, "host preemption was not measured: this host keeps no scheduler statistics (/proc/thread-self/schedstat)")?;
    }
    writeln!(
        out,
        "timing capture itself took {} ms over {} exits",
        ms(report.capture_ns),
        report.total().exits
    )
}

pub fn write_csv(report: &TimingReport, out: &mut dyn Write) -> Result<(), csv::Error> {
    let rows = shown_rows(report);
    let devices = devices(report);
    let mut writer = csv::Writer::from_writer(out);
    let mut header: Vec<String> = ["pid", "command", "wall_ns", "guest_ns"]
        .map(String::from)
        .to_vec();
    header.extend(devices.iter().map(|d| format!("vmm_ns:{d}")));
    header.extend(["halted_ns", "preempted_ns", "recorder_ns", "injected_ns"].map(String::from));
    header.extend(devices.iter().map(|d| format!("exits:{d}")));
    writer.write_record(&header)?;
    for row in &rows {
        let mut record = vec![
            row.pid.map_or(String::new(), |pid| pid.to_string()),
            row.command.clone(),
            row.wall_ns.to_string(),
            row.guest_ns.to_string(),
        ];
        let get = |map: &BTreeMap<String, u64>, d: &String| map.get(d).copied().unwrap_or(0);
        record.extend(devices.iter().map(|d| get(&row.vmm_ns, d).to_string()));
        record.extend(
            [
                row.halted_ns,
                row.preempted_ns,
                row.recorder_ns,
                row.injected_ns,
            ]
            .map(|ns| ns.to_string()),
        );
        record.extend(devices.iter().map(|d| get(&row.exits, d).to_string()));
        writer.write_record(&record)?;
    }
    writer.flush()?;
    Ok(())
}

#[derive(Serialize)]
struct JsonTable<'a> {
    measured: &'static str,
    estimated: &'static str,
    mode: &'a str,
    injected: &'a Option<String>,
    preemption_measured: bool,
    capture_ns: u64,
    processes: Vec<Row>,
    /// With more than one vCPU, their rows, by index.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    vcpus: Vec<Row>,
    total: Row,
}

pub fn write_json(report: &TimingReport, out: &mut dyn Write) -> io::Result<()> {
    let (processes, total) = rows(report);
    let table = JsonTable {
        measured: MEASURED,
        estimated: ESTIMATED,
        mode: &report.mode,
        injected: &report.injected,
        preemption_measured: report.preemption_measured,
        capture_ns: report.capture_ns,
        processes,
        vcpus: vcpu_rows(report),
        total,
    };
    serde_json::to_writer_pretty(&mut *out, &table)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use provm_engine::timing::report::{Times, TIMING_FORMAT};

    fn report(vcpus: usize) -> TimingReport {
        let mut report = TimingReport {
            format: TIMING_FORMAT,
            mode: "record".into(),
            injected: None,
            preemption_measured: true,
            capture_ns: 0,
            processes: Vec::new(),
            vcpus: Vec::new(),
        };
        for vcpu in 0..vcpus {
            let exit = Times {
                guest_ns: 1_000_000 * (vcpu as u64 + 1),
                ..Times::default()
            };
            report.count_for_vcpu(vcpu, "pic", &exit);
            let mut process = ProcessTiming {
                pid: 7,
                comm: "sh".into(),
                ..ProcessTiming::default()
            };
            provm_engine::timing::report::count(&mut process.devices, "pic", &exit);
            report.processes.push(process);
        }
        report
    }

    fn text(report: &TimingReport) -> String {
        let mut out = Vec::new();
        write_text(report, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_vcpu_has_a_row_when_there_are_two() {
        let report = report(2);
        let rows = vcpu_rows(&report);
        let walls: Vec<(&str, u64)> = rows
            .iter()
            .map(|row| (row.command.as_str(), row.wall_ns))
            .collect();
        assert_eq!(walls, [("(vCPU 0)", 1_000_000), ("(vCPU 1)", 2_000_000)]);
        let shown = text(&report);
        assert!(shown.contains("(vCPU 1)"), "{shown}");
        let mut json = Vec::new();
        write_json(&report, &mut json).unwrap();
        assert!(String::from_utf8(json).unwrap().contains("\"vcpus\""));
    }

    #[test]
    fn one_vcpu_adds_no_rows() {
        let report = report(1);
        assert!(vcpu_rows(&report).is_empty());
        assert!(!text(&report).contains("(vCPU"));
        let mut json = Vec::new();
        write_json(&report, &mut json).unwrap();
        assert!(!String::from_utf8(json).unwrap().contains("\"vcpus\""));
    }
}
