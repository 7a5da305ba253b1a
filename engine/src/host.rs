//! The host a recording names in its manifest, and whether a replay runs
//! on the same KVM.

use provm_cpu_model::{self as cpu_model, Platform};
use provm_trace::manifest::HostDescription;

/// What a trace says about its recording host: informational, and what a
/// replay compares (`same_kvm`).
pub fn description() -> HostDescription {
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    HostDescription {
        kernel: kernel_release(),
        cpu,
        hypervisor: hypervisor().into(),
    }
}

/// Whether this host runs the KVM `recorded` names, on the same CPU: the
/// same kernel release, hypervisor and CPU model. What the guest sees of
/// the CPU is checked apart (`cpu_model`); this is about the vCPU state
/// KVM saves beside it, which follows the host's CPU too: a trace recorded
/// on SVM 6.12 with QEMU's EPYC-Milan matched its memory and devices on an
/// EPYC with the same kernel, and its registers at power-off differed.
pub fn same_kvm(recorded: &HostDescription) -> bool {
    recorded.kernel == kernel_release()
        && recorded.hypervisor == hypervisor()
        && recorded.cpu == description().cpu
}

fn kernel_release() -> String {
    read("/proc/sys/kernel/osrelease").trim().to_owned()
}

fn hypervisor() -> &'static str {
    match Platform::detect() {
        Platform::Pvm => cpu_model::PVM_HYPERVISOR,
        Platform::Hardware => "KVM",
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_on_another_kernel_hypervisor_or_cpu_is_another_kvm() {
        let here = description();
        assert!(same_kvm(&here));
        let other_kernel = HostDescription {
            kernel: format!("{}-other", here.kernel),
            ..here.clone()
        };
        assert!(!same_kvm(&other_kernel));
        let other_hypervisor = HostDescription {
            hypervisor: format!("{}-other", here.hypervisor),
            ..here.clone()
        };
        assert!(!same_kvm(&other_hypervisor));
        let other_cpu = HostDescription {
            cpu: format!("{}-other", here.cpu),
            ..here.clone()
        };
        assert!(!same_kvm(&other_cpu));
    }
}
