//! The guest's CPU model as a trace's manifest records it, and the check a
//! replay makes that this host offers every feature the recorded guest saw.

use provm_trace::manifest::{self, CpuModel, CpuidRegister};
use provm_vmm::cpuid::{self, FeatureWord, Register};

/// The manifest's record of a guest CPU with `features`, whose kernel was
/// told to ignore `ignored_by_kernel`.
pub fn recorded(features: &[FeatureWord], ignored_by_kernel: &[&str]) -> CpuModel {
    CpuModel {
        features: features.iter().map(to_manifest).collect(),
        ignored_by_kernel: ignored_by_kernel.iter().map(|s| s.to_string()).collect(),
    }
}

/// The features of the recorded `model` that `offered` (this host's) lacks,
/// by name.
pub fn missing_here(model: &CpuModel, offered: &[FeatureWord]) -> Vec<String> {
    let required: Vec<FeatureWord> = model.features.iter().map(from_manifest).collect();
    cpuid::missing_features(&required, offered)
}

fn to_manifest(word: &FeatureWord) -> manifest::FeatureWord {
    manifest::FeatureWord {
        leaf: word.leaf,
        subleaf: word.subleaf,
        register: match word.register {
            Register::Ebx => CpuidRegister::Ebx,
            Register::Ecx => CpuidRegister::Ecx,
            Register::Edx => CpuidRegister::Edx,
        },
        value: word.value,
    }
}

fn from_manifest(word: &manifest::FeatureWord) -> FeatureWord {
    FeatureWord {
        leaf: word.leaf,
        subleaf: word.subleaf,
        register: match word.register {
            CpuidRegister::Ebx => Register::Ebx,
            CpuidRegister::Ecx => Register::Ecx,
            CpuidRegister::Edx => Register::Edx,
        },
        value: word.value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_model_round_trips_and_keeps_its_json_shape() {
        let words = [FeatureWord {
            leaf: 7,
            subleaf: 0,
            register: Register::Ebx,
            value: 0b10_0000,
        }];
        let model = recorded(&words, &["tsc"]);
        assert_eq!(
            serde_json::to_value(&model).unwrap(),
            serde_json::json!({
                "features": [{"leaf": 7, "subleaf": 0, "register": "Ebx", "value": 32}],
                "ignored_by_kernel": ["tsc"],
            })
        );
        assert!(missing_here(&model, &words).is_empty());
        assert_eq!(missing_here(&model, &[]), ["avx2"]);
    }
}
