//! On PVM the guest's user-mode CPUID runs natively (the "user-cpuid"
//! hole), and leaf 1's EBX[31:24] is the APIC ID of the host core the vCPU
//! thread happens to run on. glibc keeps that leaf in memory at every
//! program's start, so a run whose thread moved between cores left a
//! different byte in guest memory than its replay: the state check saw it.
//! Keeping the vCPU thread on one core (the first it may use) makes the
//! value the same for a recording and its replay on the same host.

use std::sync::OnceLock;

use provm_cpu_model::Platform;

/// The cores the process could use before `keep_vcpu_on_one_core` kept it
/// on the first.
static CORES: OnceLock<Vec<usize>> = OnceLock::new();

/// Keeps the calling thread (the vCPU's) on the first host core it may run
/// on, where the guest's user-mode CPUID would otherwise name any; a no-op
/// elsewhere than PVM. Best effort: if the kernel refuses, the thread
/// keeps its cores and a state check may tell.
pub(crate) fn keep_vcpu_on_one_core() {
    if Platform::detect() != Platform::Pvm {
        return;
    }
    // SAFETY: plain data, filled and read by the kernel's affinity calls
    // for the calling thread (pid 0).
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            return;
        }
        let cores: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &allowed))
            .collect();
        let Some(&first) = cores.first() else {
            return;
        };
        CORES.get_or_init(|| cores);
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(first, &mut one);
        libc::sched_setaffinity(0, size, &one);
    }
}

/// Lets the calling thread, a vCPU's in a parallel run, run on every core
/// `keep_vcpu_on_one_core` found, since threads inherit the one core it
/// kept: the host's scheduler then places the vCPUs, moving one off a
/// core that another program keeps busy (pinned to a core each, a vCPU
/// waited for its busy core: on this 2-core host with a test bed on one,
/// side by side was 1.5 times as slow as one at a time). Only where
/// nothing is replayed: user-mode CPUID then names whichever core. A
/// no-op where nothing was pinned.
pub(crate) fn unpin_vcpu() {
    let Some(cores) = CORES.get() else {
        return;
    };
    // SAFETY: plain data, read by the kernel's affinity call for the
    // calling thread (pid 0).
    unsafe {
        let mut all: libc::cpu_set_t = std::mem::zeroed();
        for &core in cores {
            libc::CPU_SET(core, &mut all);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &all);
    }
}
