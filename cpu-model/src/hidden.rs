//! What provm hides of the host's CPU: the guest's CPU model is the host's
//! KVM-supported CPUID with features taken away, for three different reasons kept in three lists:
//! - `DETERMINISM`: sources of nondeterminism (time, randomness, CPU
//!   identity, interrupt hardware) that the VMM must own; hidden on every host.
//! - `VIRTUALIZATION`: the host's own virtualization features, which KVM
//!   offers only on some hosts (nested=1, some AMD parts); hidden on every
//!   host, so that a trace moves between host kinds.
//! - `EMULATOR_HOLES`: instructions that PVM, this project's development
//!   platform, cannot emulate in guest ring 0; hidden only on PVM, so that on
//!   a VMX/SVM host the guest keeps x86-64-v2 and more (RHEL 9 userlands
//!   need v2).

use std::path::Path;

use crate::entry::{CpuidEntry, Register};

/// Which KVM serves /dev/kvm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// PVM (`kvm_pvm`): guest ring 0 is emulated, and KVM_SET_CPUID2 does
    /// not take effect (the guest sees the host's CPUID).
    Pvm,
    /// KVM on VMX or SVM: the guest runs on the hardware, which enforces
    /// the CPUID the VMM sets.
    Hardware,
}

impl Platform {
    /// The platform of this host's /dev/kvm.
    pub fn detect() -> Self {
        if Path::new("/sys/module/kvm_pvm").exists() {
            Platform::Pvm
        } else {
            Platform::Hardware
        }
    }

    /// Every feature the guest does not see on this platform.
    pub fn hidden_features(self) -> impl Iterator<Item = &'static HiddenFeature> {
        let holes = match self {
            Platform::Pvm => EMULATOR_HOLES,
            Platform::Hardware => &[],
        };
        DETERMINISM.iter().chain(VIRTUALIZATION).chain(holes)
    }

    /// Whether leaf `function` is removed whole here (`DROPPED_LEAVES`).
    fn drops_leaf(self, function: u32) -> bool {
        DROPPED_LEAVES.iter().any(|dropped| {
            dropped.functions.contains(&function) && (!dropped.pvm_only || self == Platform::Pvm)
        })
    }
}

/// Leaves removed whole from the guest's CPUID: reading one gives zeros.
pub struct DroppedLeaf {
    pub functions: std::ops::RangeInclusive<u32>,
    /// Dropped only on PVM.
    pub pvm_only: bool,
    pub why: &'static str,
}

const fn drop_leaves(
    functions: std::ops::RangeInclusive<u32>,
    pvm_only: bool,
    why: &'static str,
) -> DroppedLeaf {
    DroppedLeaf {
        functions,
        pvm_only,
        why,
    }
}

pub const DROPPED_LEAVES: &[DroppedLeaf] = &[
    drop_leaves(0xa..=0xa, false, "performance monitoring: no PMU"),
    drop_leaves(
        0xd..=0xd,
        true,
        "XSAVE state components: XSAVE is hidden on PVM",
    ),
    drop_leaves(0x12..=0x12, false, "SGX enclave leaves: sgx is hidden"),
    drop_leaves(
        0x14..=0x14,
        false,
        "Intel processor trace: intel_pt is hidden",
    ),
    drop_leaves(
        0x4000_0000..=0x4000_00ff,
        false,
        "KVM's paravirtual interface (kvmclock, async page faults, ...): the guest must see no clock or event source but the VMM's devices, nor which hypervisor runs it",
    ),
    drop_leaves(
        0x8000_000a..=0x8000_000a,
        false,
        "SVM's features, for a guest's own VMs: svm is hidden",
    ),
    drop_leaves(
        0x8000_001f..=0x8000_001f,
        false,
        "SEV/SME memory encryption: a host's capability (kvm_amd sev=1); provm's guest is not encrypted",
    ),
    drop_leaves(
        0x8000_0022..=0x8000_0022,
        false,
        "AMD performance monitoring v2: no PMU",
    ),
];

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

const TIME: &str = "guest time must come from the VMM's virtual clock, not the host TSC";
const ENTROPY: &str = "guest entropy must come from the VMM, where it can be logged";
const IRQ: &str = "interrupts are delivered by the VMM's 8259 PIC at VM exits, no local APIC";
const IDENTITY: &str = "a fixed CPU model: host-specific detail the guest must not depend on";
const NO_PMU: &str = "no performance counters for the guest";
const NO_MCA: &str = "no machine-check architecture in the VM";
const TSX: &str = "transactional memory aborts nondeterministically";

/// Hidden on every host: each would let the guest observe something the VMM
/// neither controls nor logs, so a replay could not reproduce it.
pub const DETERMINISM: &[HiddenFeature] = &[
    // Leaf 1, ECX.
    hide("dtes64", 1, 0, Ecx, 2, IDENTITY),
    hide(
        "monitor",
        1,
        0,
        Ecx,
        3,
        "MONITOR/MWAIT idle would hide halts from the VMM",
    ),
    hide("est", 1, 0, Ecx, 7, IDENTITY),
    hide("pdcm", 1, 0, Ecx, 15, NO_PMU),
    hide("x2apic", 1, 0, Ecx, 21, IRQ),
    hide("tsc_deadline_timer", 1, 0, Ecx, 24, TIME),
    hide("rdrand", 1, 0, Ecx, 30, ENTROPY),
    // Leaf 1, EDX.
    hide("tsc", 1, 0, Edx, 4, TIME),
    hide("mce", 1, 0, Edx, 7, NO_MCA),
    hide("apic", 1, 0, Edx, 9, IRQ),
    hide("mca", 1, 0, Edx, 14, NO_MCA),
    hide("dts", 1, 0, Edx, 21, NO_PMU),
    hide("acpi", 1, 0, Edx, 22, IDENTITY),
    hide("ht", 1, 0, Edx, 28, "one vCPU"),
    hide("tm", 1, 0, Edx, 29, IDENTITY),
    // Leaf 7.0.
    hide("tsc_adjust", 7, 0, Ebx, 1, TIME),
    hide("sgx", 7, 0, Ebx, 2, IDENTITY),
    hide("hle", 7, 0, Ebx, 4, TSX),
    hide("rtm", 7, 0, Ebx, 11, TSX),
    hide("mpx", 7, 0, Ebx, 14, IDENTITY),
    hide("rdseed", 7, 0, Ebx, 18, ENTROPY),
    hide(
        "intel_pt",
        7,
        0,
        Ebx,
        25,
        "processor trace writes packets (with timestamps) the VMM neither saves nor replays",
    ),
    hide("waitpkg", 7, 0, Ecx, 5, TIME),
    hide(
        "rdpid",
        7,
        0,
        Ecx,
        22,
        "reads the host's TSC_AUX: CPU identity",
    ),
    hide("sgx_lc", 7, 0, Ecx, 30, "SGX launch control: follows sgx"),
    hide("tsxldtrk", 7, 0, Edx, 16, TSX),
    // Extended leaves.
    hide("rdtscp", 0x8000_0001, 0, Edx, 27, TIME),
    hide("constant_tsc", 0x8000_0007, 0, Edx, 8, TIME),
];

const NESTED: &str = "a guest's own VMs: provm neither snapshots nor replays their state, and KVM offers the bit only with nested=1";

/// Hidden on every host: what KVM reports of the host's own virtualization.
/// Linux 6.1 and 6.12 KVM (arch/x86/kvm/cpuid.c, vmx.c, svm.c) report
/// these bits, and the leaves in `DROPPED_LEAVES` that go with them
/// (0x8000000a SVM, 0x12 SGX, 0x14 PT, 0x8000001f SEV); they do not set the
/// `hypervisor` bit (leaf 1 ECX bit 31) and KVM's own leaves are dropped.
pub const VIRTUALIZATION: &[HiddenFeature] = &[
    hide("vmx", 1, 0, Ecx, 5, NESTED),
    hide("svm", 0x8000_0001, 0, Ecx, 2, NESTED),
    hide(
        "virt_ssbd",
        0x8000_0008,
        0,
        Ebx,
        25,
        "a hypervisor's interface (MSR VIRT_SPEC_CTRL), offered by KVM only on some AMD hosts",
    ),
];

const EMULATOR: &str = "guest ring 0 is emulated on PVM and the emulator lacks it";
const VEX: &str = "VEX-encoded instructions: not emulated in guest ring 0 on PVM";

/// Hidden only on PVM (see PLATFORM.md): the guest kernel would stop with an
/// emulation failure on these, or take emulator paths that are slow or wrong.
pub const EMULATOR_HOLES: &[HiddenFeature] = &[
    // Leaf 1, ECX.
    hide("pclmulqdq", 1, 0, Ecx, 1, EMULATOR),
    hide("fma", 1, 0, Ecx, 12, VEX),
    hide(
        "cx16",
        1,
        0,
        Ecx,
        13,
        "lock cmpxchg16b (SLUB) is not emulated",
    ),
    hide("pcid", 1, 0, Ecx, 17, EMULATOR),
    hide("movbe", 1, 0, Ecx, 22, EMULATOR),
    hide(
        "popcnt",
        1,
        0,
        Ecx,
        23,
        "popcnt (hweight alternatives) is not emulated",
    ),
    hide("aes", 1, 0, Ecx, 25, EMULATOR),
    hide("xsave", 1, 0, Ecx, 26, "xrstor (FPU init) is not emulated"),
    hide("osxsave", 1, 0, Ecx, 27, "follows xsave"),
    hide("avx", 1, 0, Ecx, 28, VEX),
    hide("f16c", 1, 0, Ecx, 29, VEX),
    // Leaf 7.0, EBX.
    hide("fsgsbase", 7, 0, Ebx, 0, EMULATOR),
    hide("bmi1", 7, 0, Ebx, 3, VEX),
    hide("avx2", 7, 0, Ebx, 5, VEX),
    hide("smep", 7, 0, Ebx, 7, EMULATOR),
    hide("bmi2", 7, 0, Ebx, 8, VEX),
    hide("erms", 7, 0, Ebx, 9, EMULATOR),
    hide("invpcid", 7, 0, Ebx, 10, EMULATOR),
    hide("avx512f", 7, 0, Ebx, 16, VEX),
    hide("avx512dq", 7, 0, Ebx, 17, VEX),
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
    hide("movdiri", 7, 0, Ecx, 27, EMULATOR),
    hide("movdir64b", 7, 0, Ecx, 28, EMULATOR),
    // Leaf 7.0, EDX.
    hide("fsrm", 7, 0, Edx, 4, EMULATOR),
    hide("avx512_vp2intersect", 7, 0, Edx, 8, VEX),
    hide("serialize", 7, 0, Edx, 14, EMULATOR),
    hide("amx_bf16", 7, 0, Edx, 22, VEX),
    hide("avx512_fp16", 7, 0, Edx, 23, VEX),
    hide("amx_tile", 7, 0, Edx, 24, VEX),
    hide("amx_int8", 7, 0, Edx, 25, VEX),
    // Leaf 0x80000001, ECX.
    hide("abm", 0x8000_0001, 0, Ecx, 5, "lzcnt is not emulated"),
    hide("sse4a", 0x8000_0001, 0, Ecx, 6, EMULATOR),
    hide("xop", 0x8000_0001, 0, Ecx, 11, VEX),
    hide("fma4", 0x8000_0001, 0, Ecx, 16, VEX),
    hide("tbm", 0x8000_0001, 0, Ecx, 21, VEX),
];

/// Linux's name for a feature bit provm hides, where it hides it
/// (`baseline::feature_name` knows the baselines' too).
pub fn hidden_feature_name(
    leaf: u32,
    subleaf: u32,
    register: Register,
    bit: u8,
) -> Option<&'static str> {
    DETERMINISM
        .iter()
        .chain(VIRTUALIZATION)
        .chain(EMULATOR_HOLES)
        .find(|f| (f.leaf, f.subleaf, f.register, f.bit) == (leaf, subleaf, register, bit))
        .map(|f| f.name)
}

/// The guest's CPUID on `platform`: `supported` (KVM_GET_SUPPORTED_CPUID)
/// minus the features hidden there, with one logical processor and APIC ID 0.
pub fn guest_cpuid(supported: &[CpuidEntry], platform: Platform) -> Vec<CpuidEntry> {
    supported
        .iter()
        .filter(|entry| !platform.drops_leaf(entry.function))
        .map(|entry| {
            let mut entry = *entry;
            for feature in platform.hidden_features() {
                if feature.leaf == entry.function && feature.subleaf == entry.index {
                    *entry.register_mut(feature.register) &= !(1u32 << feature.bit);
                }
            }
            if entry.function == 1 {
                // EBX[23:16] logical processors, EBX[31:24] initial APIC ID.
                entry.ebx = (entry.ebx & 0xffff) | (1 << 16);
            }
            entry
        })
        .collect()
}

/// The features hidden on `platform` that `effective` (what KVM reports the
/// vCPU has after KVM_SET_CPUID2) still shows. PVM replaces the VMM's CPUID
/// with the host's: there the guest kernel must be told to ignore these
/// itself (`clearcpuid=`).
pub fn unenforced(effective: &[CpuidEntry], platform: Platform) -> Vec<&'static HiddenFeature> {
    platform
        .hidden_features()
        .filter(|feature| {
            effective.iter().any(|entry| {
                entry.function == feature.leaf
                    && entry.index == feature.subleaf
                    && entry.register(feature.register) & (1 << feature.bit) != 0
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> CpuidEntry {
        CpuidEntry::all_ones(function, index)
    }

    fn all_features() -> Vec<CpuidEntry> {
        vec![
            entry(1, 0),
            entry(7, 0),
            entry(0x8000_0001, 0),
            entry(0x8000_0008, 0),
        ]
    }

    fn visible(leaves: &[CpuidEntry], leaf: u32, register: Register, bit: u8) -> bool {
        leaves
            .iter()
            .any(|e| e.function == leaf && e.register(register) & (1 << bit) != 0)
    }

    #[test]
    fn hides_every_listed_feature_and_nothing_else() {
        for platform in [Platform::Pvm, Platform::Hardware] {
            let leaves = guest_cpuid(&all_features(), platform);
            for feature in platform.hidden_features() {
                assert!(
                    !visible(&leaves, feature.leaf, feature.register, feature.bit),
                    "{} still visible on {platform:?}",
                    feature.name
                );
            }
            // Features in neither list stay: SSE2 (leaf 1 EDX bit 26), long mode.
            assert!(visible(&leaves, 1, Edx, 26));
            assert!(visible(&leaves, 0x8000_0001, Edx, 29));
        }
    }

    /// x86-64-v2 (cx16, popcnt, sse3, ssse3, sse4.1, sse4.2, lahf_lm), which
    /// RHEL 9 userlands require, survives wherever the hardware enforces
    /// CPUID; on PVM the emulator's holes are hidden.
    #[test]
    fn hardware_keeps_x86_64_v2_and_pvm_hides_the_emulator_holes() {
        let x86_64_v2 = [
            (1, Ecx, 13),
            (1, Ecx, 23),
            (1, Ecx, 0),
            (1, Ecx, 9),
            (1, Ecx, 19),
            (1, Ecx, 20),
            (0x8000_0001, Ecx, 0),
        ];
        let hardware = guest_cpuid(&all_features(), Platform::Hardware);
        for (leaf, register, bit) in x86_64_v2 {
            assert!(
                visible(&hardware, leaf, register, bit),
                "{leaf:#x} {register:?} bit {bit}"
            );
        }
        for feature in EMULATOR_HOLES {
            assert!(visible(
                &hardware,
                feature.leaf,
                feature.register,
                feature.bit
            ));
        }
        let pvm = guest_cpuid(&all_features(), Platform::Pvm);
        for name in [
            "cx16", "xsave", "smap", "smep", "popcnt", "movbe", "bmi1", "avx",
        ] {
            let feature = EMULATOR_HOLES.iter().find(|f| f.name == name).unwrap();
            assert!(
                !visible(&pvm, feature.leaf, feature.register, feature.bit),
                "{name}"
            );
        }
    }

    #[test]
    fn one_cpu_with_apic_id_zero() {
        let leaves = guest_cpuid(&[entry(1, 0)], Platform::Hardware);
        assert_eq!(leaves[0].ebx >> 16, 1);
    }

    #[test]
    fn kvm_paravirt_and_pmu_leaves_are_dropped_and_xsave_leaves_only_on_pvm() {
        let host = [
            entry(0, 0),
            entry(0xa, 0),
            entry(0xd, 1),
            entry(0x4000_0001, 0),
        ];
        let functions = |platform| -> Vec<u32> {
            guest_cpuid(&host, platform)
                .iter()
                .map(|e| e.function)
                .collect()
        };
        assert_eq!(functions(Platform::Pvm), [0]);
        assert_eq!(functions(Platform::Hardware), [0, 0xd]);
    }

    /// What a nested-capable SVM or VMX host's KVM reports of its own
    /// virtualization never reaches the guest, on any host.
    #[test]
    fn the_hosts_virtualization_is_hidden_everywhere() {
        let host = [
            entry(1, 0),
            entry(0x12, 0),
            entry(0x14, 0),
            entry(0x8000_0001, 0),
            entry(0x8000_0008, 0),
            entry(0x8000_000a, 0),
            entry(0x8000_001f, 0),
            entry(0x8000_0021, 0),
            entry(0x8000_0022, 0),
        ];
        for platform in [Platform::Pvm, Platform::Hardware] {
            let guest = guest_cpuid(&host, platform);
            let functions: Vec<u32> = guest.iter().map(|e| e.function).collect();
            assert_eq!(
                functions,
                [1, 0x8000_0001, 0x8000_0008, 0x8000_0021],
                "{platform:?}"
            );
            assert!(!visible(&guest, 1, Ecx, 5), "vmx");
            assert!(!visible(&guest, 0x8000_0001, Ecx, 2), "svm");
            assert!(!visible(&guest, 0x8000_0008, Ebx, 25), "virt_ssbd");
        }
        for dropped in DROPPED_LEAVES {
            assert!(!dropped.why.is_empty());
            assert!(dropped.functions.start() <= dropped.functions.end());
        }
    }

    #[test]
    fn features_a_hypervisor_left_visible_become_kernel_arguments() {
        let honoured = guest_cpuid(&[entry(1, 0), entry(7, 0)], Platform::Pvm);
        assert!(unenforced(&honoured, Platform::Pvm).is_empty());
        assert_eq!(
            kernel_args_hiding(&unenforced(&honoured, Platform::Pvm)),
            ""
        );

        // PVM ignores KVM_SET_CPUID2: the guest sees the host's leaf 1.
        let ignored = [entry(1, 0)];
        let visible = unenforced(&ignored, Platform::Pvm);
        assert_eq!(
            visible.len(),
            Platform::Pvm
                .hidden_features()
                .filter(|f| f.leaf == 1)
                .count()
        );
        let args = kernel_args_hiding(&visible);
        assert!(args.starts_with("clearcpuid=dtes64,monitor,"), "{args}");
        assert!(
            args.contains(",xsave,") && args.ends_with(" noxsave"),
            "{args}"
        );
        // Elsewhere the emulator's holes are not the kernel's business.
        let args = kernel_args_hiding(&unenforced(&ignored, Platform::Hardware));
        assert!(!args.contains("cx16") && args.contains("rdrand"), "{args}");
    }

    #[test]
    fn tables_have_no_duplicates_and_valid_bits() {
        let all: Vec<&HiddenFeature> = DETERMINISM
            .iter()
            .chain(VIRTUALIZATION)
            .chain(EMULATOR_HOLES)
            .collect();
        for (i, a) in all.iter().enumerate() {
            assert!(a.bit < 32);
            for b in &all[i + 1..] {
                let same = (a.leaf, a.subleaf, a.register, a.bit)
                    == (b.leaf, b.subleaf, b.register, b.bit);
                assert!(!same, "{} and {} name the same bit", a.name, b.name);
                assert_ne!(a.name, b.name);
            }
        }
    }
}
