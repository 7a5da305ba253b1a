//! A run's exit timing, aggregated per guest process and device: what the
//! trace's timing section and `provm run --timing FILE` hold. Bounded in
//! size whatever the run's length: one row per process and device, each
//! with a fixed-bucket histogram of its exits' latencies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The layout of the JSON below; a reader refuses others.
pub const TIMING_FORMAT: u32 = 1;
/// Histogram buckets: bucket `i` counts exits whose latency is below
/// `1 µs << i` (and at least the bucket before's bound); the last also
/// takes everything longer.
pub const BUCKETS: usize = 24;

/// The latency percentiles blame reports (`provm blame A B`, the
/// `blame_devices` table).
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// The upper bound of histogram bucket `index`, in nanoseconds.
pub fn bucket_bound_ns(index: usize) -> u64 {
    1000 << index
}

fn bucket_of(latency_ns: u64) -> usize {
    (0..BUCKETS)
        .find(|&index| latency_ns < bucket_bound_ns(index))
        .unwrap_or(BUCKETS - 1)
}

/// One device's exits while one process ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceTiming {
    pub exits: u64,
    #[serde(flatten)]
    pub times: Times,
    /// Exit latency (VMM + logging: from the exit to the next entry, halts
    /// aside) per bucket (see `BUCKETS`).
    pub latency: Vec<u64>,
}

/// Where host time went around one exit, or around many summed. Host
/// nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Times {
    /// In the guest before the exits.
    pub guest_ns: u64,
    /// In the VMM handling them (injected delay included).
    pub vmm_ns: u64,
    /// Halted after them, waiting for a tick.
    pub halted_ns: u64,
    /// The recorder logging them.
    pub logging_ns: u64,
    /// Of `vmm_ns`, delay injected on purpose (`--inject-exit-delay`,
    /// `--what-if`).
    pub injected_ns: u64,
    /// Host preemption of the vCPU thread (sampled; part of the above).
    pub preempted_ns: u64,
}

impl Times {
    fn add(&mut self, other: &Times) {
        self.guest_ns += other.guest_ns;
        self.vmm_ns += other.vmm_ns;
        self.halted_ns += other.halted_ns;
        self.logging_ns += other.logging_ns;
        self.injected_ns += other.injected_ns;
        self.preempted_ns += other.preempted_ns;
    }
}

impl DeviceTiming {
    /// Everything but preemption, which is part of the rest.
    pub fn total_ns(&self) -> u64 {
        self.times.guest_ns + self.hypervisor_ns() + self.times.halted_ns
    }

    /// The virtualization layer's share: the VMM and the recorder.
    pub fn hypervisor_ns(&self) -> u64 {
        self.times.vmm_ns + self.times.logging_ns
    }

    pub fn add(&mut self, other: &DeviceTiming) {
        self.exits += other.exits;
        self.times.add(&other.times);
        if self.latency.len() < BUCKETS {
            self.latency.resize(BUCKETS, 0);
        }
        for (mine, theirs) in self.latency.iter_mut().zip(&other.latency) {
            *mine += theirs;
        }
    }

    /// Counts one exit.
    pub fn count(&mut self, exit: &Times) {
        if self.latency.is_empty() {
            self.latency = vec![0; BUCKETS];
        }
        self.exits += 1;
        self.times.add(exit);
        self.latency[bucket_of(exit.vmm_ns + exit.logging_ns)] += 1;
    }

    /// The latency below which a fraction `q` of the exits fall, to the
    /// resolution of the buckets (their upper bound), if there are exits.
    pub fn latency_quantile_ns(&self, q: f64) -> Option<u64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let wanted = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        self.latency.iter().enumerate().find_map(|(index, &n)| {
            seen += n;
            (seen >= wanted).then(|| bucket_bound_ns(index))
        })
    }
}

/// A guest process's exits, by device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessTiming {
    /// The process id (thread group); 0 for the idle task and -1 where the
    /// running task could not be read.
    pub pid: i32,
    /// Its command name (the kernel's `comm`, 15 bytes at most).
    pub comm: String,
    pub devices: BTreeMap<String, DeviceTiming>,
}

impl ProcessTiming {
    /// All its devices together.
    pub fn total(&self) -> DeviceTiming {
        let mut total = DeviceTiming::default();
        for device in self.devices.values() {
            total.add(device);
        }
        total
    }
}

/// A run's timing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingReport {
    pub format: u32,
    /// What was running: `run`, `record` or `replay`.
    pub mode: String,
    /// The delay injected, if any (`DEVICE:DURATION`, or a what-if).
    pub injected: Option<String>,
    /// Whether host preemption was measured (the host keeps scheduler
    /// statistics); when false the preemption columns are 0.
    pub preemption_measured: bool,
    /// The capture's own cost: the observer's time over all exits.
    pub capture_ns: u64,
    pub processes: Vec<ProcessTiming>,
    /// The same exits by vCPU (index) and device; absent in a report of
    /// an older provm.
    #[serde(default)]
    pub vcpus: Vec<BTreeMap<String, DeviceTiming>>,
}

/// Counts one exit of `device` in `devices`.
pub fn count(devices: &mut BTreeMap<String, DeviceTiming>, device: &str, exit: &Times) {
    // Looked up before inserting: no allocation at a known device.
    match devices.get_mut(device) {
        Some(timing) => timing.count(exit),
        None => devices.entry(device.to_owned()).or_default().count(exit),
    }
}

impl TimingReport {
    /// Counts one exit of `device` for vCPU `vcpu`.
    pub fn count_for_vcpu(&mut self, vcpu: usize, device: &str, exit: &Times) {
        if self.vcpus.len() <= vcpu {
            self.vcpus.resize_with(vcpu + 1, BTreeMap::new);
        }
        count(&mut self.vcpus[vcpu], device, exit);
    }

    /// The whole run, by device.
    pub fn by_device(&self) -> BTreeMap<String, DeviceTiming> {
        let mut devices: BTreeMap<String, DeviceTiming> = BTreeMap::new();
        for process in &self.processes {
            for (name, timing) in &process.devices {
                devices.entry(name.clone()).or_default().add(timing);
            }
        }
        devices
    }

    /// The whole run.
    pub fn total(&self) -> DeviceTiming {
        let mut total = DeviceTiming::default();
        for device in self.by_device().values() {
            total.add(device);
        }
        total
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("serialises")
    }

    pub fn from_json(bytes: &[u8]) -> Result<TimingReport, String> {
        let report: TimingReport = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if report.format != TIMING_FORMAT {
            return Err(format!(
                "timing format {} (this provm reads {TIMING_FORMAT})",
                report.format
            ));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_power_of_two_microsecond_buckets() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(999), 0);
        assert_eq!(bucket_of(1000), 1);
        assert_eq!(bucket_of(3_000), 2);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_come_from_the_histogram() {
        let mut device = DeviceTiming::default();
        for vmm_ns in [500, 1500, 1500, 10_000] {
            device.count(&Times {
                vmm_ns,
                ..Times::default()
            });
        }
        assert_eq!(device.latency_quantile_ns(0.25), Some(1000));
        assert_eq!(device.latency_quantile_ns(0.5), Some(2000));
        assert_eq!(device.latency_quantile_ns(1.0), Some(16_000));
        assert_eq!(DeviceTiming::default().latency_quantile_ns(0.5), None);
    }
}
