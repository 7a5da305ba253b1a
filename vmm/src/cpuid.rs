//! The guest's CPU model: the host's KVM-supported CPUID with a fixed list of
//! features taken away. Each removal keeps the guest kernel off an instruction
//! this platform's KVM cannot emulate in guest ring 0, or off a source of
//! nondeterminism (time, randomness, CPU identity) that the VMM must own.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Register {
    Ebx,
    Ecx,
    Edx,
}

/// One CPUID feature bit the guest does not see.
#[derive(Debug)]
pub struct HiddenFeature {
    /// Linux's name for it (/proc/cpuinfo), as `clearcpuid=` takes it.
    pub name: &'static str,
    pub leaf: u32,
    pub subleaf: u32,
    pub register: Register,
    pub bit: u8,
    pub why: &'static str,
}

const fn hide(
    name: &'static str,
    leaf: u32,
    subleaf: u32,
    register: Register,
    bit: u8,
    why: &'static str,
) -> HiddenFeature {
    HiddenFeature {
        name,
        leaf,
        subleaf,
        register,
        bit,
        why,
    }
}

use Register::{Ebx, Ecx, Edx};

const EMULATOR: &str = "guest ring 0 is emulated here and the emulator lacks it";
const VEX: &str = "VEX-encoded instructions: not emulated in guest ring 0 here";
const TIME: &str = "guest time must come from the VMM's virtual clock, not the host TSC";
const ENTROPY: &str = "guest entropy must come from the VMM, where it can be logged";
const IRQ: &str = "interrupts are delivered by the VMM's 8259 PIC at VM exits, no local APIC";
const IDENTITY: &str = "a fixed CPU model: host-specific detail the guest must not depend on";

/// Every feature the guest does not see, and why.
pub const HIDDEN_FEATURES: &[HiddenFeature] = &[
    // Leaf 1, ECX.
    hide("pclmulqdq", 1, 0, Ecx, 1, EMULATOR),
    hide("dtes64", 1, 0, Ecx, 2, IDENTITY),
    hide(
        "monitor",
        1,
        0,
        Ecx,
        3,
        "MONITOR/MWAIT idle would hide halts from the VMM",
    ),
    hide("vmx", 1, 0, Ecx, 5, IDENTITY),
    hide("est", 1, 0, Ecx, 7, IDENTITY),
    hide("fma", 1, 0, Ecx, 12, VEX),
    hide(
        "cx16",
        1,
        0,
        Ecx,
        13,
        "lock cmpxchg16b (SLUB) is not emulated",
    ),
    hide(
        "pdcm",
        1,
        0,
        Ecx,
        15,
        "no performance counters for the guest",
    ),
    hide("pcid", 1, 0, Ecx, 17, EMULATOR),
    hide("x2apic", 1, 0, Ecx, 21, IRQ),
    hide("movbe", 1, 0, Ecx, 22, EMULATOR),
    hide(
        "popcnt",
        1,
        0,
        Ecx,
        23,
        "popcnt (hweight alternatives) is not emulated",
    ),
    hide("tsc_deadline_timer", 1, 0, Ecx, 24, TIME),
    hide("aes", 1, 0, Ecx, 25, EMULATOR),
    hide("xsave", 1, 0, Ecx, 26, "xrstor (FPU init) is not emulated"),
    hide("osxsave", 1, 0, Ecx, 27, "follows xsave"),
    hide("avx", 1, 0, Ecx, 28, VEX),
    hide("f16c", 1, 0, Ecx, 29, VEX),
    hide("rdrand", 1, 0, Ecx, 30, ENTROPY),
    // Leaf 1, EDX.
    hide("tsc", 1, 0, Edx, 4, TIME),
    hide(
        "mce",
        1,
        0,
        Edx,
        7,
        "no machine-check architecture in the VM",
    ),
    hide("apic", 1, 0, Edx, 9, IRQ),
    hide(
        "mca",
        1,
        0,
        Edx,
        14,
        "no machine-check architecture in the VM",
    ),
    hide(
        "dts",
        1,
        0,
        Edx,
        21,
        "no performance counters for the guest",
    ),
    hide("acpi", 1, 0, Edx, 22, IDENTITY),
    hide("ht", 1, 0, Edx, 28, "one vCPU"),
    hide("tm", 1, 0, Edx, 29, IDENTITY),
    // Leaf 7.0, EBX.
    hide("fsgsbase", 7, 0, Ebx, 0, EMULATOR),
    hide("tsc_adjust", 7, 0, Ebx, 1, TIME),
    hide("sgx", 7, 0, Ebx, 2, IDENTITY),
    hide("bmi1", 7, 0, Ebx, 3, VEX),
    hide(
        "hle",
        7,
        0,
        Ebx,
        4,
        "transactional memory aborts nondeterministically",
    ),
    hide("avx2", 7, 0, Ebx, 5, VEX),
    hide("smep", 7, 0, Ebx, 7, EMULATOR),
    hide("bmi2", 7, 0, Ebx, 8, VEX),
    hide("erms", 7, 0, Ebx, 9, EMULATOR),
    hide("invpcid", 7, 0, Ebx, 10, EMULATOR),
    hide(
        "rtm",
        7,
        0,
        Ebx,
        11,
        "transactional memory aborts nondeterministically",
    ),
    hide("mpx", 7, 0, Ebx, 14, IDENTITY),
    hide("avx512f", 7, 0, Ebx, 16, VEX),
    hide("avx512dq", 7, 0, Ebx, 17, VEX),
    hide("rdseed", 7, 0, Ebx, 18, ENTROPY),
    hide("adx", 7, 0, Ebx, 19, EMULATOR),
    hide("smap", 7, 0, Ebx, 20, "clac/stac (SMAP) are not emulated"),
    hide("avx512ifma", 7, 0, Ebx, 21, VEX),
    hide("avx512pf", 7, 0, Ebx, 26, VEX),
    hide("avx512er", 7, 0, Ebx, 27, VEX),
    hide("avx512cd", 7, 0, Ebx, 28, VEX),
    hide("sha_ni", 7, 0, Ebx, 29, EMULATOR),
    hide("avx512bw", 7, 0, Ebx, 30, VEX),
    hide("avx512vl", 7, 0, Ebx, 31, VEX),
    // Leaf 7.0, ECX.
    hide("avx512vbmi", 7, 0, Ecx, 1, VEX),
    hide("umip", 7, 0, Ecx, 2, EMULATOR),
    hide("pku", 7, 0, Ecx, 3, EMULATOR),
    hide("waitpkg", 7, 0, Ecx, 5, TIME),
    hide("avx512_vbmi2", 7, 0, Ecx, 6, VEX),
    hide("gfni", 7, 0, Ecx, 8, EMULATOR),
    hide("vaes", 7, 0, Ecx, 9, VEX),
    hide("vpclmulqdq", 7, 0, Ecx, 10, VEX),
    hide("avx512_vnni", 7, 0, Ecx, 11, VEX),
    hide("avx512_bitalg", 7, 0, Ecx, 12, VEX),
    hide("avx512_vpopcntdq", 7, 0, Ecx, 14, VEX),
    hide(
        "la57",
        7,
        0,
        Ecx,
        16,
        "five-level paging is not needed and not emulated",
    ),
    hide("rdpid", 7, 0, Ecx, 22, "CPU identity, and not emulated"),
    hide("movdiri", 7, 0, Ecx, 27, EMULATOR),
    hide("movdir64b", 7, 0, Ecx, 28, EMULATOR),
    // Leaf 7.0, EDX.
    hide("fsrm", 7, 0, Edx, 4, EMULATOR),
    hide("avx512_vp2intersect", 7, 0, Edx, 8, VEX),
    hide("serialize", 7, 0, Edx, 14, EMULATOR),
    hide(
        "tsxldtrk",
        7,
        0,
        Edx,
        16,
        "transactional memory aborts nondeterministically",
    ),
    hide("amx_bf16", 7, 0, Edx, 22, VEX),
    hide("avx512_fp16", 7, 0, Edx, 23, VEX),
    hide("amx_tile", 7, 0, Edx, 24, VEX),
    hide("amx_int8", 7, 0, Edx, 25, VEX),
    // Leaf 0x80000001.
    hide("abm", 0x8000_0001, 0, Ecx, 5, "lzcnt is not emulated"),
    hide("sse4a", 0x8000_0001, 0, Ecx, 6, EMULATOR),
    hide("xop", 0x8000_0001, 0, Ecx, 11, VEX),
    hide("fma4", 0x8000_0001, 0, Ecx, 16, VEX),
    hide("tbm", 0x8000_0001, 0, Ecx, 21, VEX),
    hide("rdtscp", 0x8000_0001, 0, Edx, 27, TIME),
    // Leaf 0x80000007.
    hide("constant_tsc", 0x8000_0007, 0, Edx, 8, TIME),
];

/// Leaves removed whole: they describe things the guest must not use.
fn leaf_is_dropped(function: u32) -> bool {
    matches!(
        function,
        // Performance monitoring: no PMU.
        0xa
        // XSAVE state components: XSAVE is hidden.
        | 0xd
        // KVM's paravirtual interface (kvmclock, async page faults, ...):
        // the guest must see no clock or event source but the VMM's devices.
        | 0x4000_0000..=0x4000_00ff
    )
}

/// The guest's CPUID: `supported` (KVM_GET_SUPPORTED_CPUID) minus the hidden
/// features, with one logical processor and APIC ID 0.
pub fn guest_cpuid(supported: &CpuId) -> CpuId {
    let entries: Vec<kvm_cpuid_entry2> = supported
        .as_slice()
        .iter()
        .filter(|entry| !leaf_is_dropped(entry.function))
        .map(|entry| {
            let mut entry = *entry;
            for feature in HIDDEN_FEATURES {
                if feature.leaf == entry.function && feature.subleaf == entry.index {
                    *register_mut(&mut entry, feature.register) &= !(1u32 << feature.bit);
                }
            }
            if entry.function == 1 {
                // EBX[23:16] logical processors, EBX[31:24] initial APIC ID.
                entry.ebx = (entry.ebx & 0xffff) | (1 << 16);
            }
            entry
        })
        .collect();
    CpuId::from_entries(&entries).expect("fewer entries than KVM supplied")
}

/// The hidden features that `effective` (what KVM reports the vCPU has
/// after KVM_SET_CPUID2) still shows. Some hypervisors replace the VMM's
/// CPUID with the host's, as PVM does: there the guest kernel must be told
/// to ignore these itself (`clearcpuid=`).
pub fn unenforced(effective: &CpuId) -> Vec<&'static HiddenFeature> {
    HIDDEN_FEATURES
        .iter()
        .filter(|feature| {
            effective.as_slice().iter().any(|entry| {
                entry.function == feature.leaf
                    && entry.index == feature.subleaf
                    && register(entry, feature.register) & (1 << feature.bit) != 0
            })
        })
        .collect()
}

/// Kernel arguments that hide `features` from the guest kernel.
pub fn kernel_args_hiding(features: &[&HiddenFeature]) -> String {
    if features.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = features.iter().map(|feature| feature.name).collect();
    let mut args = format!("clearcpuid={}", names.join(","));
    // Clearing the bit does not stop the FPU code probing XSAVE state.
    if names.contains(&"xsave") {
        args += " noxsave";
    }
    args
}

/// One 32-bit word of CPUID feature flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FeatureWord {
    pub leaf: u32,
    pub subleaf: u32,
    pub register: Register,
    pub value: u32,
}

/// The words that hold the feature flags software tests: leaf 1, leaf 7
/// subleaf 0, and the extended leaf 0x80000001.
const FEATURE_WORDS: [(u32, u32, Register); 7] = [
    (1, 0, Ecx),
    (1, 0, Edx),
    (7, 0, Ebx),
    (7, 0, Ecx),
    (7, 0, Edx),
    (0x8000_0001, 0, Ecx),
    (0x8000_0001, 0, Edx),
];

/// The feature words of a vCPU's CPUID: what its guest can find.
pub fn feature_words(cpuid: &CpuId) -> Vec<FeatureWord> {
    FEATURE_WORDS
        .iter()
        .map(|&(leaf, subleaf, reg)| FeatureWord {
            leaf,
            subleaf,
            register: reg,
            value: cpuid
                .as_slice()
                .iter()
                .find(|e| e.function == leaf && e.index == subleaf)
                .map_or(0, |entry| register(entry, reg)),
        })
        .collect()
}

/// The features set in `required` that `offered` lacks, named as Linux names
/// them where provm knows the name, else by leaf, register and bit.
pub fn missing_features(required: &[FeatureWord], offered: &[FeatureWord]) -> Vec<String> {
    let mut missing = Vec::new();
    for word in required {
        let here = offered
            .iter()
            .find(|o| (o.leaf, o.subleaf, o.register) == (word.leaf, word.subleaf, word.register))
            .map_or(0, |o| o.value);
        for bit in 0..32u8 {
            if word.value & !here & (1 << bit) == 0 {
                continue;
            }
            let known = HIDDEN_FEATURES.iter().find(|f| {
                (f.leaf, f.subleaf, f.register, f.bit)
                    == (word.leaf, word.subleaf, word.register, bit)
            });
            missing.push(match known {
                Some(feature) => feature.name.to_owned(),
                None => format!(
                    "CPUID leaf {:#x}.{} {:?} bit {bit}",
                    word.leaf, word.subleaf, word.register
                ),
            });
        }
    }
    missing
}

fn register(entry: &kvm_cpuid_entry2, register: Register) -> u32 {
    match register {
        Ebx => entry.ebx,
        Ecx => entry.ecx,
        Edx => entry.edx,
    }
}

fn register_mut(entry: &mut kvm_cpuid_entry2, register: Register) -> &mut u32 {
    match register {
        Ebx => &mut entry.ebx,
        Ecx => &mut entry.ecx,
        Edx => &mut entry.edx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ebx: u32::MAX,
            ecx: u32::MAX,
            edx: u32::MAX,
            ..Default::default()
        }
    }

    fn guest(entries: &[kvm_cpuid_entry2]) -> Vec<kvm_cpuid_entry2> {
        guest_cpuid(&CpuId::from_entries(entries).unwrap())
            .as_slice()
            .to_vec()
    }

    #[test]
    fn missing_features_are_named() {
        let words = |value| {
            feature_words(
                &CpuId::from_entries(&[kvm_cpuid_entry2 {
                    function: 7,
                    ecx: 0,
                    ebx: value,
                    ..Default::default()
                }])
                .unwrap(),
            )
        };
        // avx2 (bit 5) is known by name; bit 6 is not in provm's table.
        let missing = missing_features(&words(0b110_0001), &words(0b1));
        assert_eq!(missing, ["avx2", "CPUID leaf 0x7.0 Ebx bit 6"]);
        assert!(missing_features(&words(1), &words(0b11)).is_empty());
    }

    #[test]
    fn hides_every_listed_feature_and_nothing_else() {
        let leaves = guest(&[entry(1, 0), entry(7, 0), entry(0x8000_0001, 0)]);
        for feature in HIDDEN_FEATURES {
            let leaf = leaves.iter().find(|e| e.function == feature.leaf);
            let Some(leaf) = leaf else { continue };
            assert_eq!(
                register(leaf, feature.register) & (1 << feature.bit),
                0,
                "{} still visible",
                feature.name
            );
        }
        // Features not in the table stay: SSE2 (leaf 1 EDX bit 26), long mode.
        assert_ne!(leaves[0].edx & (1 << 26), 0);
        assert_ne!(leaves[2].edx & (1 << 29), 0);
    }

    #[test]
    fn one_cpu_with_apic_id_zero() {
        let leaves = guest(&[entry(1, 0)]);
        assert_eq!(leaves[0].ebx >> 16, 1);
    }

    #[test]
    fn kvm_paravirt_pmu_and_xsave_leaves_are_dropped() {
        let leaves = guest(&[
            entry(0, 0),
            entry(0xa, 0),
            entry(0xd, 1),
            entry(0x4000_0001, 0),
        ]);
        assert_eq!(leaves.iter().map(|e| e.function).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn features_a_hypervisor_left_visible_become_kernel_arguments() {
        let honoured = guest_cpuid(&CpuId::from_entries(&[entry(1, 0), entry(7, 0)]).unwrap());
        assert!(unenforced(&honoured).is_empty());
        assert_eq!(kernel_args_hiding(&unenforced(&honoured)), "");

        let ignored = CpuId::from_entries(&[entry(1, 0)]).unwrap();
        let visible = unenforced(&ignored);
        assert_eq!(
            visible.len(),
            HIDDEN_FEATURES.iter().filter(|f| f.leaf == 1).count()
        );
        let args = kernel_args_hiding(&visible);
        assert!(args.starts_with("clearcpuid=pclmulqdq,dtes64,"), "{args}");
        assert!(
            args.contains(",xsave,") && args.ends_with(" noxsave"),
            "{args}"
        );
    }

    #[test]
    fn table_has_no_duplicates_and_valid_bits() {
        for (i, a) in HIDDEN_FEATURES.iter().enumerate() {
            assert!(a.bit < 32);
            for b in &HIDDEN_FEATURES[i + 1..] {
                let same = (a.leaf, a.subleaf, a.register, a.bit)
                    == (b.leaf, b.subleaf, b.register, b.bit);
                assert!(!same, "{} and {} name the same bit", a.name, b.name);
                assert_ne!(a.name, b.name);
            }
        }
    }
}
