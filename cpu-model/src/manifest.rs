//! The guest's CPU model as a trace's manifest records it (`CpuModel`: the
//! whole CPUID table; `provm-trace`'s manifest holds it), and the checks a replay makes before it starts that this host
//! can present it.
//!
//! On PVM the guest has two views of its CPU: its kernel runs emulated and
//! reads the table KVM holds (KVM_GET_CPUID2: what the VMM set, but with
//! the host's own feature flags in leaves 1 and 7), while its user space
//! runs natively and the CPUID instruction there returns the host's own
//! CPUID. A recording on PVM therefore also keeps that user-space view,
//! read on the recording host with the CPUID instruction. A VMX/SVM host
//! presents one table to both, so it cannot replay a PVM recording; a PVM
//! host cannot present any user-space view but its own.

use serde::{Deserialize, Serialize};

use crate::baseline::Baseline;
use crate::check::{self, CpuProbe};
use crate::entry::CpuidEntry;
use crate::hidden::Platform;

/// The CPU the guest saw: its whole CPUID table as KVM gave it (every leaf
/// and subleaf of KVM_GET_CPUID2), which a replay sets again and checks, and
/// the hidden features the kernel was told to ignore because KVM left them
/// visible.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuModel {
    pub cpuid: Vec<CpuidEntry>,
    pub ignored_by_kernel: Vec<String>,
    /// The model asked for (`provm record --cpu`): `host`, `x86-64-v2`,
    /// `x86-64-v3`. Absent from the traces of older provm versions, which
    /// all recorded the host's.
    #[serde(default)]
    pub baseline: Option<String>,
    /// Recorded on PVM: what the guest's user space saw at each leaf and
    /// subleaf of `cpuid`, the recording host's own CPUID (user-mode CPUID
    /// runs natively there), where the kernel saw `cpuid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_space_cpuid: Option<Vec<CpuidEntry>>,
}

/// How `HostDescription::hypervisor` names PVM.
pub const PVM_HYPERVISOR: &str = "KVM (PVM)";

/// The manifest's record of a guest CPU with the CPUID table `cpuid`, whose
/// kernel was told to ignore `ignored_by_kernel`, booted with `baseline` on
/// `platform`.
pub fn recorded(
    cpuid: &[CpuidEntry],
    ignored_by_kernel: &[&str],
    baseline: Baseline,
    platform: Platform,
) -> CpuModel {
    let user_space_cpuid = (platform == Platform::Pvm).then(|| user_space_view(cpuid));
    CpuModel {
        cpuid: cpuid.to_vec(),
        ignored_by_kernel: ignored_by_kernel.iter().map(|s| s.to_string()).collect(),
        baseline: Some(baseline.name().into()),
        user_space_cpuid,
    }
}

/// The CPUID table of the recorded `model`, as the VMM sets it.
pub fn table(model: &CpuModel) -> Vec<CpuidEntry> {
    model.cpuid.clone()
}

/// What guest user space sees on PVM, at each leaf and subleaf of `like`:
/// this host's own CPUID, read with the CPUID instruction.
fn user_space_view(like: &[CpuidEntry]) -> Vec<CpuidEntry> {
    like.iter()
        .map(|entry| {
            let native = std::arch::x86_64::__cpuid_count(entry.function, entry.index);
            CpuidEntry {
                eax: native.eax,
                ebx: native.ebx,
                ecx: native.ecx,
                edx: native.edx,
                ..*entry
            }
        })
        .collect()
}

/// Why a replay here could not show the guest the CPU it was recorded with.
#[derive(Debug, thiserror::Error)]
pub enum CpuRefusal {
    #[error("this host's CPU lacks features the recorded guest saw: {}", .0.join(", "))]
    Lacks(Vec<String>),
    #[error("the trace was recorded on PVM, where the guest's user space saw the recording host's own CPUID (the CPUID instruction runs natively there), not the table its kernel saw; this VMX/SVM host presents one table to both, so it cannot present that user-space view{}. Replay it on a PVM host with the recording's CPU, or record with --cpu x86-64-v2 or -v3 on a VMX/SVM host for a trace that moves", lacking_too(.0))]
    RecordedOnPvm(Vec<String>),
    #[error("this host is PVM, which cannot present the recorded CPUID to the guest's user space: the CPUID instruction runs natively there and returns this host's own CPUID. Replay on {}. Where the user-space view here differs:\n  {}", if *.recorded_on_pvm { "a PVM host with the recording's CPU" } else { "a VMX/SVM host" }, .differences.join("\n  "))]
    PvmUserSpace {
        recorded_on_pvm: bool,
        differences: Vec<String>,
    },
}

fn lacking_too(missing: &[String]) -> String {
    if missing.is_empty() {
        return String::new();
    }
    format!(" (nor does it have {})", missing.join(", "))
}

/// Refuses, naming the leaf or feature, when this host (`probe`, on
/// `platform`) cannot present the CPU `model`, recorded under
/// `recording_hypervisor` (`HostDescription::hypervisor`).
pub fn check_here(
    model: &CpuModel,
    recording_hypervisor: &str,
    probe: &CpuProbe,
    platform: Platform,
) -> Result<(), CpuRefusal> {
    let missing = check::lacking(&table(model), &probe.supported, &probe.guest);
    let recorded_on_pvm =
        model.user_space_cpuid.is_some() || recording_hypervisor == PVM_HYPERVISOR;
    if platform == Platform::Hardware && recorded_on_pvm {
        return Err(CpuRefusal::RecordedOnPvm(missing));
    }
    if !missing.is_empty() {
        return Err(CpuRefusal::Lacks(missing));
    }
    if platform == Platform::Pvm {
        // Traces of older provm versions recorded on PVM lack the
        // user-space view; the restore still compares the kernel's.
        let user_space = match (&model.user_space_cpuid, recorded_on_pvm) {
            (Some(view), _) => view.clone(),
            (None, false) => table(model),
            (None, true) => return Ok(()),
        };
        let differences = check::differences(&user_space, &user_space_view(&user_space));
        if !differences.is_empty() {
            return Err(CpuRefusal::PvmUserSpace {
                recorded_on_pvm,
                differences,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(offered: Vec<CpuidEntry>) -> CpuProbe {
        CpuProbe {
            supported: offered,
            guest: Vec::new(),
            ignored_by_kernel: Vec::new(),
            kernel_args: String::new(),
        }
    }

    fn avx2() -> CpuidEntry {
        CpuidEntry {
            function: 7,
            flags: 1,
            ebx: 0b10_0000,
            ..Default::default()
        }
    }

    #[test]
    fn a_recorded_model_round_trips_and_keeps_its_json_shape() {
        let model = recorded(&[avx2()], &["tsc"], Baseline::X86_64V3, Platform::Hardware);
        assert_eq!(
            serde_json::to_value(&model).unwrap(),
            serde_json::json!({
                "cpuid": [{"function": 7, "index": 0, "flags": 1, "eax": 0, "ebx": 32, "ecx": 0, "edx": 0}],
                "ignored_by_kernel": ["tsc"],
                "baseline": "x86-64-v3",
            })
        );
        assert_eq!(table(&model), [avx2()]);
        // Older manifests have neither a baseline nor a user-space view.
        let old: CpuModel = serde_json::from_value(serde_json::json!({
            "cpuid": [], "ignored_by_kernel": [],
        }))
        .unwrap();
        assert_eq!((old.baseline, old.user_space_cpuid), (None, None));
    }

    #[test]
    fn a_hardware_recording_is_checked_for_features_by_name() {
        let model = recorded(&[avx2()], &[], Baseline::Host, Platform::Hardware);
        let here = |offered| check_here(&model, "KVM", &probe(offered), Platform::Hardware);
        assert!(here(vec![avx2()]).is_ok());
        let refused = here(Vec::new()).unwrap_err().to_string();
        assert_eq!(
            refused,
            "this host's CPU lacks features the recorded guest saw: avx2"
        );
    }

    /// A PVM recording keeps the user-space view, and a VMX/SVM host, which
    /// presents one table to kernel and user space, refuses it saying so.
    #[test]
    fn a_pvm_recording_is_refused_on_hardware_for_its_user_space_view() {
        let model = recorded(&[avx2()], &[], Baseline::Host, Platform::Pvm);
        let view = model.user_space_cpuid.as_ref().expect("recorded on PVM");
        assert_eq!((view[0].function, view[0].index), (7, 0));
        for (model, hypervisor) in [
            (&model, "KVM"),
            // An older PVM trace, known by its host description.
            (
                &CpuModel {
                    user_space_cpuid: None,
                    ..model.clone()
                },
                PVM_HYPERVISOR,
            ),
        ] {
            let refused = check_here(model, hypervisor, &probe(vec![avx2()]), Platform::Hardware)
                .unwrap_err()
                .to_string();
            assert!(refused.contains("recorded on PVM"), "{refused}");
            assert!(
                refused.contains("cannot present that user-space view."),
                "{refused}"
            );
        }
        let refused = check_here(&model, "KVM", &probe(Vec::new()), Platform::Hardware)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("user-space view (nor does it have avx2)"),
            "{refused}"
        );
    }

    /// On PVM (this host when it is one) a recording of this host's own
    /// user-space view is accepted; a VMX/SVM recording whose table differs
    /// from this host's CPUID is refused, naming the leaf.
    #[test]
    fn pvm_checks_the_user_space_view_against_its_own_cpuid() {
        let host = user_space_view(&[
            CpuidEntry::default(),
            CpuidEntry {
                function: 1,
                ..Default::default()
            },
        ]);
        let pvm = recorded(&host, &[], Baseline::Host, Platform::Pvm);
        assert!(check_here(&pvm, PVM_HYPERVISOR, &probe(host.clone()), Platform::Pvm).is_ok());

        let mut other = host.clone();
        // Another signature (family/model/stepping), as a baseline's.
        other[1].eax ^= 1;
        let svm = recorded(&other, &[], Baseline::X86_64V2, Platform::Hardware);
        let refused = check_here(&svm, "KVM", &probe(host), Platform::Pvm)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("cannot present the recorded CPUID to the guest's user space"),
            "{refused}"
        );
        assert!(refused.contains("Replay on a VMX/SVM host"), "{refused}");
        assert!(refused.contains("CPUID leaf 0x1.0 Eax"), "{refused}");
    }
}
