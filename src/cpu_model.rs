//! The guest's CPU model as a trace's manifest records it (the whole CPUID
//! table), and the check a replay makes that this host can give a guest
//! every feature the recorded guest saw.

use provm_trace::manifest::{self, CpuModel};
use provm_vmm::cpuid::CpuidEntry;
use provm_vmm::cpuid_check;
use provm_vmm::vm::CpuProbe;

/// The manifest's record of a guest CPU with the CPUID table `cpuid`, whose
/// kernel was told to ignore `ignored_by_kernel`.
pub fn recorded(cpuid: &[CpuidEntry], ignored_by_kernel: &[&str]) -> CpuModel {
    CpuModel {
        cpuid: cpuid.iter().map(to_manifest).collect(),
        ignored_by_kernel: ignored_by_kernel.iter().map(|s| s.to_string()).collect(),
    }
}

/// The CPUID table of the recorded `model`, as the VMM sets it.
pub fn table(model: &CpuModel) -> Vec<CpuidEntry> {
    model.cpuid.iter().map(from_manifest).collect()
}

/// The features of the recorded `model` that this host (`probe`) cannot
/// give a guest, by name.
pub fn missing_here(model: &CpuModel, probe: &CpuProbe) -> Vec<String> {
    cpuid_check::lacking(&table(model), &probe.supported, &probe.guest)
}

fn to_manifest(entry: &CpuidEntry) -> manifest::CpuidEntry {
    manifest::CpuidEntry {
        function: entry.function,
        index: entry.index,
        flags: entry.flags,
        eax: entry.eax,
        ebx: entry.ebx,
        ecx: entry.ecx,
        edx: entry.edx,
    }
}

fn from_manifest(entry: &manifest::CpuidEntry) -> CpuidEntry {
    CpuidEntry {
        function: entry.function,
        index: entry.index,
        flags: entry.flags,
        eax: entry.eax,
        ebx: entry.ebx,
        ecx: entry.ecx,
        edx: entry.edx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_model_round_trips_and_keeps_its_json_shape() {
        let avx2 = CpuidEntry {
            function: 7,
            flags: 1,
            ebx: 0b10_0000,
            ..Default::default()
        };
        let model = recorded(&[avx2], &["tsc"]);
        assert_eq!(
            serde_json::to_value(&model).unwrap(),
            serde_json::json!({
                "cpuid": [{"function": 7, "index": 0, "flags": 1, "eax": 0, "ebx": 32, "ecx": 0, "edx": 0}],
                "ignored_by_kernel": ["tsc"],
            })
        );
        assert_eq!(table(&model), [avx2]);
        let probe = |offered: Vec<CpuidEntry>| CpuProbe {
            supported: offered,
            guest: Vec::new(),
            ignored_by_kernel: Vec::new(),
            kernel_args: String::new(),
        };
        assert!(missing_here(&model, &probe(vec![avx2])).is_empty());
        assert_eq!(missing_here(&model, &probe(Vec::new())), ["avx2"]);
    }
}
