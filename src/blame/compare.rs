//! Two runs side by side (`provm blame A B`), and a run against itself
//! replayed under a changed exit cost (`provm blame RUN --what-if`).
//!
//! A replay makes exactly the recorded exits, so a what-if is paired: the
//! trace is replayed once as it was and once with the change, and each
//! process's measured time under the change is set against the time the
//! blame model predicts from the first replay (its exits of the device
//! times the added cost).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use provm_engine::replay::{self, ReplayOptions};
use provm_engine::timing::report::{DeviceTiming, ProcessTiming, TimingReport, QUANTILES};
use provm_engine::timing::TimingObserver;
use provm_vmm::exit_timing::{ExitDelay, ExtraCost};
use serde::Serialize;

use super::table::{ms, Row};
use super::BlameError;

/// A process is the same in two runs of one command if its pid and
/// command are (pids follow from the snapshot the runs restore).
fn key(process: &ProcessTiming) -> (String, i32) {
    (process.comm.clone(), process.pid)
}

pub fn write_difference(a: &TimingReport, b: &TimingReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "per process, B - A (ms): wall, guest, VMM, halted")?;
    writeln!(
        out,
        "{:>6}  {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "pid", "command", "wall A", "wall B", "wall B-A", "guest B-A", "VMM B-A", "halt B-A"
    )?;
    let index = |report: &TimingReport| -> BTreeMap<(String, i32), Row> {
        report
            .processes
            .iter()
            .map(|p| (key(p), Row::process(p)))
            .collect()
    };
    let (rows_a, rows_b) = (index(a), index(b));
    let mut keys: Vec<&(String, i32)> = rows_a.keys().chain(rows_b.keys()).collect();
    keys.sort();
    keys.dedup();
    let zero = |row: Option<&Row>| {
        row.map_or((0, 0, 0, 0), |r| {
            (r.wall_ns, r.guest_ns, r.vmm_total_ns(), r.halted_ns)
        })
    };
    let diff = |x: u64, y: u64| format!("{:+.3}", (y as f64 - x as f64) / 1e6);
    for key in keys {
        let (wa, ga, va, ha) = zero(rows_a.get(key));
        let (wb, gb, vb, hb) = zero(rows_b.get(key));
        writeln!(
            out,
            "{:>6}  {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            key.1,
            key.0,
            ms(wa),
            ms(wb),
            diff(wa, wb),
            diff(ga, gb),
            diff(va, vb),
            diff(ha, hb)
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "per device: exits, VMM time (ms) and exit latency percentiles (bucket upper bounds, µs), A -> B"
    )?;
    let (devices_a, devices_b) = (a.by_device(), b.by_device());
    let mut names: Vec<&String> = devices_a.keys().chain(devices_b.keys()).collect();
    names.sort();
    names.dedup();
    let empty = DeviceTiming::default();
    for name in names {
        let da = devices_a.get(name).unwrap_or(&empty);
        let db = devices_b.get(name).unwrap_or(&empty);
        let quantiles: Vec<String> = QUANTILES
            .iter()
            .map(|&q| {
                let us = |d: &DeviceTiming| {
                    d.latency_quantile_ns(q)
                        .map_or("-".into(), |ns| (ns / 1000).to_string())
                };
                format!("p{}: {} -> {}", (q * 100.0) as u32, us(da), us(db))
            })
            .collect();
        writeln!(
            out,
            "{name:<16} exits {} -> {}  VMM {} -> {} ms ({})  {}",
            da.exits,
            db.exits,
            ms(da.times.vmm_ns),
            ms(db.times.vmm_ns),
            diff(da.times.vmm_ns, db.times.vmm_ns),
            quantiles.join("  ")
        )?;
    }
    Ok(())
}

/// One process under a what-if: its whole time, and the hypervisor's
/// share of it (VMM and recorder), in the replay as recorded (baseline),
/// as the model predicts under the change, and as the replay under the
/// change measured.
#[derive(Debug, Serialize)]
pub struct Prediction {
    pub pid: i32,
    pub command: String,
    pub baseline_ns: u64,
    pub predicted_ns: u64,
    pub measured_ns: u64,
    pub baseline_hypervisor_ns: u64,
    pub predicted_hypervisor_ns: u64,
    pub measured_hypervisor_ns: u64,
}

/// The added cost the model predicts for `device` timings under `delay`.
pub fn predicted_extra_ns(delay: &ExitDelay, device: &DeviceTiming) -> u64 {
    match delay.cost {
        ExtraCost::Fixed(extra) => device.exits * extra.as_nanos() as u64,
        ExtraCost::Scaled(factor) => (device.times.vmm_ns as f64 * (factor - 1.0)) as u64,
    }
}

/// Replays `trace` as recorded and under `delay`, and sets each process's
/// measured time against its prediction.
pub fn what_if(
    trace: &Path,
    delay: &ExitDelay,
    timeout: Duration,
) -> Result<Vec<Prediction>, BlameError> {
    super::load(trace)?;
    let baseline = timed_replay(trace, None, timeout)?;
    let changed = timed_replay(trace, Some(delay.clone()), timeout)?;
    let measured: BTreeMap<(String, i32), DeviceTiming> = changed
        .processes
        .iter()
        .map(|p| (key(p), p.total()))
        .collect();
    let mut predictions: Vec<Prediction> = baseline
        .processes
        .iter()
        .map(|process| {
            let total = process.total();
            let extra = process
                .devices
                .get(&delay.device)
                .map_or(0, |device| predicted_extra_ns(delay, device));
            let after = measured.get(&key(process)).cloned().unwrap_or_default();
            Prediction {
                pid: process.pid,
                command: process.comm.clone(),
                baseline_ns: total.total_ns(),
                predicted_ns: total.total_ns() + extra,
                measured_ns: after.total_ns(),
                baseline_hypervisor_ns: total.hypervisor_ns(),
                predicted_hypervisor_ns: total.hypervisor_ns() + extra,
                measured_hypervisor_ns: after.hypervisor_ns(),
            }
        })
        .collect();
    predictions.sort_by_key(|p| std::cmp::Reverse(p.measured_ns));
    Ok(predictions)
}

/// A replay of `trace` with timing captured, and `delay` injected.
fn timed_replay(
    trace: &Path,
    delay: Option<ExitDelay>,
    timeout: Duration,
) -> Result<TimingReport, BlameError> {
    let options = ReplayOptions {
        timeout,
        ..ReplayOptions::for_analysis(trace.to_owned())
    };
    let mut timing = TimingObserver::new("replay", true, delay);
    let (report, _) = replay::replay_observed(&options, &mut [&mut timing], Vec::new())?;
    report.analysable().map_err(BlameError::Diverged)?;
    Ok(timing.report().expect("timing was asked for"))
}

pub fn write_what_if(
    delay: &ExitDelay,
    predictions: &[Prediction],
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "what if {}: the trace replayed as recorded (baseline) and with the change (measured); predicted = baseline + the change's cost over the baseline's exits of the device. Times in ms; \"hypervisor\" is the VMM's and the recorder's share",
        delay
    )?;
    writeln!(
        out,
        "{:>6}  {:<16} {:>12} {:>12} {:>12} {:>8}   {:>10} {:>10} {:>10} {:>8}",
        "pid",
        "command",
        "baseline",
        "predicted",
        "measured",
        "error",
        "hyp base",
        "hyp pred",
        "hyp meas",
        "error"
    )?;
    let error = |measured: u64, predicted: u64| {
        if predicted == 0 {
            return "-".to_owned();
        }
        format!(
            "{:+.1}%",
            (measured as f64 - predicted as f64) / predicted as f64 * 100.0
        )
    };
    for p in predictions {
        writeln!(
            out,
            "{:>6}  {:<16} {:>12} {:>12} {:>12} {:>8}   {:>10} {:>10} {:>10} {:>8}",
            p.pid,
            p.command,
            ms(p.baseline_ns),
            ms(p.predicted_ns),
            ms(p.measured_ns),
            error(p.measured_ns, p.predicted_ns),
            ms(p.baseline_hypervisor_ns),
            ms(p.predicted_hypervisor_ns),
            ms(p.measured_hypervisor_ns),
            error(p.measured_hypervisor_ns, p.predicted_hypervisor_ns),
        )?;
    }
    writeln!(
        out,
        "the whole times vary from replay to replay with the guest's own time (host load); the hypervisor share is what the change acts on"
    )
}
