//! The VMM's exit timing, attributed to the guest process running at each
//! exit and aggregated as it comes (see `report`).
//!
//! The running task is read from the exiting vCPU's `current_task`
//! through the kernel's own page tables (`init_top_pgt`), which no
//! process's exit can free: three page walks in guest RAM per exit (four
//! in an SMP kernel, whose per-CPU areas are one more read away), no ioctl.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use provm_analysis::profile::Symbols;
use provm_analysis::KernelInfo;
use provm_vmm::exit_timing::{self, ExitDelay, ExitObserver, ExitTiming};
use provm_vmm::memory::GuestMemory;
use provm_vmm::paging;
use provm_vmm::vm::Vm;

use super::report::{count, ProcessTiming, Times, TimingReport, TIMING_FORMAT};

/// `comm`'s size in the kernel (TASK_COMM_LEN).
const COMM_LEN: usize = 16;

/// The timing being captured from a VM; `report` reads it at any time.
#[derive(Clone)]
pub struct Capture {
    shared: Arc<Mutex<Aggregate>>,
}

impl Capture {
    /// Times `vm`'s exits from now on, naming the processes with `kernel`;
    /// `mode` and `delay` are said in the report.
    pub fn attach(vm: &mut Vm, kernel: &KernelInfo, mode: &str, delay: Option<ExitDelay>) -> Self {
        let shared = Arc::new(Mutex::new(Aggregate {
            report: TimingReport {
                format: TIMING_FORMAT,
                mode: mode.to_owned(),
                injected: delay.as_ref().map(ExitDelay::to_string),
                preemption_measured: exit_timing::run_delay_available(),
                capture_ns: 0,
                processes: Vec::new(),
                vcpus: Vec::new(),
            },
            index: HashMap::new(),
        }));
        let observer = Attributor {
            reader: ProcessReader::new(kernel),
            shared: shared.clone(),
        };
        vm.time_exits(Box::new(observer), delay);
        Capture { shared }
    }

    pub fn report(&self) -> TimingReport {
        self.shared.lock().unwrap().report.clone()
    }
}

struct Aggregate {
    report: TimingReport,
    /// Where each (pid, comm) is in `report.processes`.
    index: HashMap<(i32, [u8; COMM_LEN]), usize>,
}

struct Attributor {
    reader: ProcessReader,
    shared: Arc<Mutex<Aggregate>>,
}

impl ExitObserver for Attributor {
    fn exit(&mut self, timing: &ExitTiming, memory: &GuestMemory) {
        let key = self
            .reader
            .running(memory, timing.vcpu)
            .unwrap_or((-1, [0; COMM_LEN]));
        let nanos = |d: std::time::Duration| d.as_nanos() as u64;
        let sample = Times {
            guest_ns: nanos(timing.in_guest),
            vmm_ns: nanos(timing.handling),
            halted_ns: nanos(timing.halted),
            logging_ns: nanos(timing.logging),
            injected_ns: nanos(timing.injected),
            preempted_ns: nanos(timing.run_delay),
        };
        let mut shared = self.shared.lock().unwrap();
        let Aggregate { report, index } = &mut *shared;
        report.capture_ns += nanos(timing.observing);
        report.count_for_vcpu(timing.vcpu, timing.device, &sample);
        let slot = *index.entry(key).or_insert_with(|| {
            report.processes.push(ProcessTiming {
                pid: key.0,
                comm: comm_string(&key.1),
                devices: Default::default(),
            });
            report.processes.len() - 1
        });
        count(&mut report.processes[slot].devices, timing.device, &sample);
    }
}

/// The name in a task's `comm`; an empty one is the unreadable task's.
fn comm_string(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    if end == 0 {
        return "(unreadable)".into();
    }
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Reads a vCPU's running task's pid and comm from guest RAM.
struct ProcessReader {
    cr3: u64,
    symbols: Symbols,
    tgid: u64,
    comm: u64,
}

impl ProcessReader {
    fn new(kernel: &KernelInfo) -> Self {
        ProcessReader {
            cr3: kernel.symbols.kernel_cr3(),
            symbols: kernel.symbols.clone(),
            tgid: kernel.offsets.task_struct_tgid,
            comm: kernel.offsets.task_struct_comm,
        }
    }

    fn running(&self, memory: &GuestMemory, vcpu: usize) -> Option<(i32, [u8; COMM_LEN])> {
        let read_u64 = |address| {
            let mut bytes = [0u8; 8];
            paging::read(memory, self.cr3, address, &mut bytes).map(|()| u64::from_le_bytes(bytes))
        };
        let current_task = self
            .symbols
            .per_cpu(self.symbols.current_task, vcpu, read_u64)
            .ok()?;
        let task = read_u64(current_task).ok()?;
        let mut tgid = [0u8; 4];
        paging::read(memory, self.cr3, task + self.tgid, &mut tgid).ok()?;
        let mut comm = [0u8; COMM_LEN];
        paging::read(memory, self.cr3, task + self.comm, &mut comm).ok()?;
        Some((i32::from_le_bytes(tgid), comm))
    }
}
