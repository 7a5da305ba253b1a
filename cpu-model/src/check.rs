//! Whether a host can present a recorded CPUID table: the check a replay
//! makes before it starts, and again after KVM_SET_CPUID2.
//!
//! Two comparisons:
//! - `lacking`: the feature bits the recording saw that this host cannot
//!   give a guest. KVM would present them if told to, but the instructions
//!   behind them would fault.
//! - `differences`: every register of every leaf, as the recording saw it,
//!   against what KVM_GET_CPUID2 reads back here after KVM_SET_CPUID2 of the
//!   recorded table. On VMX/SVM they are equal; on PVM, which ignores
//!   KVM_SET_CPUID2, they differ wherever this host's CPU differs from the
//!   recording host's.
//!
//! `differences` ignores only the fields KVM itself fills at run time or per
//! vCPU (`MAY_DIFFER`). Everything else is compared exactly, the entries'
//! KVM flags (whether the subleaf is significant) included, and the
//! cache and TLB descriptors of leaves 2 and 4 and the vendor, family and
//! model: KVM presents them as set, so they differ only where the host
//! replaces the table (PVM), and there a guest that reads them (glibc sizes
//! its memcpy thresholds from leaf 4) could behave differently.

use std::ops::RangeInclusive;

use crate::baseline::feature_name;
use crate::entry::{CpuidEntry, Register};

/// Every word of feature flags a guest can read (as of Linux 6.12's KVM
/// and the leaves Linux itself reads): a recorded bit set in one of these
/// must be offered by the replaying host. One entry per leaf, subleaf and
/// register.
pub const FEATURE_WORDS: &[(u32, u32, Register)] = &[
    // The basic feature flags.
    (1, 0, Register::Ecx),
    (1, 0, Register::Edx),
    // Thermal and power management (KVM offers ARAT).
    (6, 0, Register::Eax),
    // Structured extended features, subleaves 0-2.
    (7, 0, Register::Ebx),
    (7, 0, Register::Ecx),
    (7, 0, Register::Edx),
    (7, 1, Register::Eax),
    (7, 1, Register::Ebx),
    (7, 1, Register::Ecx),
    (7, 1, Register::Edx),
    (7, 2, Register::Edx),
    // XSAVE: the XCR0 and XSS state components, and the XSAVE variants.
    (0xd, 0, Register::Eax),
    (0xd, 0, Register::Edx),
    (0xd, 1, Register::Eax),
    (0xd, 1, Register::Ecx),
    (0xd, 1, Register::Edx),
    // SGX capabilities.
    (0x12, 0, Register::Eax),
    // Processor trace capabilities.
    (0x14, 0, Register::Ebx),
    (0x14, 0, Register::Ecx),
    // Key Locker.
    (0x19, 0, Register::Eax),
    (0x19, 0, Register::Ebx),
    (0x19, 0, Register::Ecx),
    // AVX10 (Linux 6.12's KVM does not offer it yet; a later one may).
    (0x24, 0, Register::Ebx),
    // Extended features, AMD's and Intel's.
    (0x8000_0001, 0, Register::Ecx),
    (0x8000_0001, 0, Register::Edx),
    (0x8000_0007, 0, Register::Edx),
    (0x8000_0008, 0, Register::Ebx),
    (0x8000_000a, 0, Register::Edx),
    (0x8000_001f, 0, Register::Eax),
    (0x8000_0021, 0, Register::Eax),
    (0x8000_0021, 0, Register::Ecx),
    (0x8000_0022, 0, Register::Eax),
    // Centaur/Zhaoxin.
    (0xc000_0001, 0, Register::Edx),
];

/// Words that are not flags but describe what the hardware does, which a
/// VMM cannot change: a recorded value must be the replaying host's. The
/// XSAVE state components' sizes and offsets (the XSAVE instructions run on
/// the hardware, in its layout: Intel and AMD place PKRU differently), and
/// the AMX tile and TMUL geometry; over the subleaves given. (The vendor is
/// such a word too: see `vendor_differs`.)
pub const HARDWARE_WORDS: &[(u32, RangeInclusive<u32>, Register, &str)] = &[
    (0xd, 2..=63, Register::Eax, "XSAVE component size"),
    (0xd, 2..=63, Register::Ebx, "XSAVE component offset"),
    (0x1d, 0..=u32::MAX, Register::Eax, "AMX palette"),
    (0x1d, 0..=u32::MAX, Register::Ebx, "AMX palette"),
    (0x1d, 0..=u32::MAX, Register::Ecx, "AMX palette"),
    (0x1e, 0..=0, Register::Ebx, "AMX TMUL geometry"),
];

/// A field that may differ between a recorded table and what a host
/// presents, and why: `leaf` (any subleaf when `subleaf` is None),
/// `register`, `mask`.
pub struct MayDiffer {
    pub leaf: u32,
    pub subleaf: Option<u32>,
    pub register: Register,
    pub mask: u32,
    pub why: &'static str,
}

/// Everything `differences` ignores: fields KVM fills itself at run time or
/// per vCPU, which may differ between two vCPUs of the same model.
pub const MAY_DIFFER: &[MayDiffer] = &[
    MayDiffer {
        leaf: 1,
        subleaf: None,
        register: Register::Ebx,
        mask: 0xff00_0000,
        why: "initial APIC ID: per vCPU (and per host CPU on PVM)",
    },
    MayDiffer {
        leaf: 1,
        subleaf: None,
        register: Register::Edx,
        mask: 1 << 9,
        why: "APIC follows the APIC base MSR's enable bit at run time (KVM's kvm_update_cpuid_runtime, seen on SVM); provm's guest runs with nolapic either way",
    },
    MayDiffer {
        leaf: 1,
        subleaf: None,
        register: Register::Ecx,
        mask: 1 << 27,
        why: "OSXSAVE follows the guest's CR4.OSXSAVE at run time",
    },
    MayDiffer {
        leaf: 7,
        subleaf: Some(0),
        register: Register::Ecx,
        mask: 1 << 4,
        why: "OSPKE follows the guest's CR4.PKE at run time",
    },
    MayDiffer {
        leaf: 0xb,
        subleaf: None,
        register: Register::Edx,
        mask: u32::MAX,
        why: "x2APIC ID of the extended topology leaf: per vCPU",
    },
    MayDiffer {
        leaf: 0x1f,
        subleaf: None,
        register: Register::Edx,
        mask: u32::MAX,
        why: "x2APIC ID of the V2 extended topology leaf: per vCPU",
    },
    MayDiffer {
        leaf: 0x8000_001e,
        subleaf: None,
        register: Register::Eax,
        mask: u32::MAX,
        why: "AMD's extended APIC ID: per CPU (KVM zeroes it; PVM's user space reads the host's)",
    },
    MayDiffer {
        leaf: 0x8000_001e,
        subleaf: None,
        register: Register::Ebx,
        mask: 0xff,
        why: "AMD's core ID: per CPU, as the extended APIC ID",
    },
    MayDiffer {
        leaf: 0x8000_001e,
        subleaf: None,
        register: Register::Ecx,
        mask: 0xff,
        why: "AMD's node ID: per CPU, as the extended APIC ID",
    },
    MayDiffer {
        leaf: 0xd,
        subleaf: Some(0),
        register: Register::Ebx,
        mask: u32::MAX,
        why: "XSAVE area size for the guest's current XCR0: follows the guest",
    },
    MayDiffer {
        leaf: 0xd,
        subleaf: Some(1),
        register: Register::Ebx,
        mask: u32::MAX,
        why: "XSAVE area size for the guest's current XCR0 and XSS: follows the guest",
    },
];

/// The CPU model of this host, as a VM would get it (`provm-vmm`'s
/// `cpu_probe::probe_cpu` reads it from KVM).
pub struct CpuProbe {
    /// What KVM can offer a guest here (KVM_GET_SUPPORTED_CPUID).
    pub supported: Vec<CpuidEntry>,
    /// The CPUID a booted guest sees here (KVM_GET_CPUID2 after setting
    /// the guest model).
    pub guest: Vec<CpuidEntry>,
    /// Hidden features KVM leaves visible, which the guest kernel is told
    /// to ignore.
    pub ignored_by_kernel: Vec<&'static str>,
    /// What the guest kernel's command line gets for it on this host.
    pub kernel_args: String,
}

const REGISTERS: [Register; 4] = [Register::Eax, Register::Ebx, Register::Ecx, Register::Edx];

/// The bits of `register` in `entry` that may differ (`MAY_DIFFER`).
fn filled_mask(entry: &CpuidEntry, register: Register) -> u32 {
    MAY_DIFFER
        .iter()
        .filter(|f| {
            f.leaf == entry.function
                && f.subleaf.is_none_or(|s| s == entry.index)
                && f.register == register
        })
        .fold(0, |mask, f| mask | f.mask)
}

/// `table` without the fields KVM fills itself: the CPU model as such. Two
/// vCPUs of one model can differ in those (on PVM the APIC ID is the host
/// CPU the thread ran on), so this is what identifies the model, e.g. in
/// the snapshot cache's key.
pub fn model_only(table: &[CpuidEntry]) -> Vec<CpuidEntry> {
    let mut model = table.to_vec();
    for entry in &mut model {
        for register in REGISTERS {
            let filled = filled_mask(entry, register);
            *entry.register_mut(register) &= !filled;
        }
    }
    model
}

fn find(table: &[CpuidEntry], function: u32, index: u32) -> Option<&CpuidEntry> {
    table
        .iter()
        .find(|e| e.function == function && e.index == index)
}

/// The bits of `bits`, by Linux's name where provm knows it, else by number.
fn name_bits(leaf: u32, subleaf: u32, register: Register, bits: u32) -> Vec<String> {
    (0..32u8)
        .filter(|bit| bits & (1 << bit) != 0)
        .map(|bit| match feature_name(leaf, subleaf, register, bit) {
            Some(name) => format!("{name} (bit {bit})"),
            None => format!("bit {bit}"),
        })
        .collect()
}

/// The features set in `recorded` that this host cannot give a guest: in
/// neither `supported` (KVM_GET_SUPPORTED_CPUID) nor `presented` (what a
/// guest here sees; on PVM the host's own CPUID, which PVM's supported list
/// understates: it omits even SSE3). Named as Linux names them where provm
/// knows the name, else by leaf, register and bit. Then the
/// `HARDWARE_WORDS` whose recorded value this host's hardware does not have.
pub fn lacking(
    recorded: &[CpuidEntry],
    supported: &[CpuidEntry],
    presented: &[CpuidEntry],
) -> Vec<String> {
    let mut missing: Vec<String> = vendor_differs(recorded, supported, presented)
        .into_iter()
        .collect();
    for &(leaf, subleaf, register) in FEATURE_WORDS {
        let word = |table| find(table, leaf, subleaf).map_or(0, |e| e.register(register));
        let absent = word(recorded) & !word(supported) & !word(presented);
        for bit in (0..32u8).filter(|bit| absent & (1 << bit) != 0) {
            missing.push(match feature_name(leaf, subleaf, register, bit) {
                Some(name) => name.to_owned(),
                None => format!("CPUID leaf {leaf:#x}.{subleaf} {register:?} bit {bit}"),
            });
        }
    }
    for (leaf, subleaves, register, what) in HARDWARE_WORDS {
        let recorded_words = recorded
            .iter()
            .filter(|e| e.function == *leaf && subleaves.contains(&e.index));
        for entry in recorded_words {
            let was = entry.register(*register);
            let here = |table| find(table, *leaf, entry.index).map(|e| e.register(*register));
            let (offered, shown) = (here(supported), here(presented));
            if was != 0 && offered != Some(was) && shown != Some(was) {
                let is = offered
                    .or(shown)
                    .map_or("none".into(), |v| format!("{v:#x}"));
                missing.push(format!(
                    "CPUID leaf {leaf:#x}.{} {register:?} ({what}): recorded {was:#x}, this host's {is}",
                    entry.index
                ));
            }
        }
    }
    missing
}

/// The CPU vendor's name in leaf 0 (EBX, EDX, ECX: "GenuineIntel").
fn vendor(table: &[CpuidEntry]) -> Option<String> {
    let entry = find(table, 0, 0)?;
    let bytes: Vec<u8> = [entry.ebx, entry.edx, entry.ecx]
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A trace moves only between hosts of the vendor it was recorded on: KVM
/// would present another vendor's name, but the hardware keeps its own
/// semantics where the vendors differ (SYSCALL and SYSENTER outside 64-bit
/// mode, SYSRET's faults, flags the manuals leave undefined), and the guest
/// kernel chose its paths by the name. Says so when the recorded vendor is
/// neither this host's KVM's nor its guests'.
fn vendor_differs(
    recorded: &[CpuidEntry],
    supported: &[CpuidEntry],
    presented: &[CpuidEntry],
) -> Option<String> {
    let was = vendor(recorded)?;
    let here = vendor(supported).or_else(|| vendor(presented))?;
    let differs = was != here && vendor(presented).is_none_or(|shown| shown != was);
    differs.then(|| {
        format!(
            "the CPU vendor: recorded {was}, this host's {here} (a trace replays on CPUs of the vendor it was recorded on)"
        )
    })
}

/// Where `presented` (read back from KVM) differs from `recorded`, one line
/// per leaf/subleaf and register, naming the differing bits.
pub fn differences(recorded: &[CpuidEntry], presented: &[CpuidEntry]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in recorded {
        let (leaf, subleaf) = (entry.function, entry.index);
        let Some(here) = find(presented, leaf, subleaf) else {
            found.push(format!(
                "CPUID leaf {leaf:#x}.{subleaf}: recorded, not presented here"
            ));
            continue;
        };
        if entry.flags != here.flags {
            found.push(format!(
                "CPUID leaf {leaf:#x}.{subleaf} flags: recorded {:#x}, presented {:#x}",
                entry.flags, here.flags
            ));
        }
        for register in REGISTERS {
            // Without the fields that may differ, in the values shown too:
            // on PVM the presented APIC ID is the host CPU this process ran
            // on, which would make the same refusal read differently from
            // one process to the next.
            let kept = !filled_mask(entry, register);
            let (was, is) = (
                entry.register(register) & kept,
                here.register(register) & kept,
            );
            let differ = was ^ is;
            if differ != 0 {
                found.push(format!(
                    "CPUID leaf {leaf:#x}.{subleaf} {register:?}: recorded {was:#010x}, presented {is:#010x}, differing {}",
                    name_bits(leaf, subleaf, register, differ).join(", ")
                ));
            }
        }
    }
    for extra in presented {
        if find(recorded, extra.function, extra.index).is_none() {
            found.push(format!(
                "CPUID leaf {:#x}.{}: presented here, not recorded",
                extra.function, extra.index
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32, ebx: u32, ecx: u32, edx: u32) -> CpuidEntry {
        CpuidEntry {
            function,
            index,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    #[test]
    fn lacking_features_are_named() {
        // avx2 (bit 5) is known by name; bit 6 is not in provm's tables.
        let recorded = [leaf(7, 0, 0b110_0001, 0, 0)];
        let missing = lacking(&recorded, &[leaf(7, 0, 0b1, 0, 0)], &[]);
        assert_eq!(missing, ["avx2", "CPUID leaf 0x7.0 Ebx bit 6"]);
        let supported = [leaf(7, 0, 0b11, 0, 0)];
        assert!(lacking(&[leaf(7, 0, 1, 0, 0)], &supported, &[]).is_empty());
        // A leaf the host does not support at all offers nothing.
        assert_eq!(lacking(&[leaf(1, 0, 0, 1 << 30, 0)], &[], &[]), ["rdrand"]);
        // What a guest here is presented (PVM: the host's CPUID) is offered.
        let presented = [leaf(1, 0, 0, 1 << 30, 0)];
        assert!(lacking(&[leaf(1, 0, 0, 1 << 30, 0)], &[], &presented).is_empty());
    }

    /// Each listed word is checked, the leaves the issue found unchecked
    /// among them; a host that offers everything lacks nothing.
    #[test]
    fn every_feature_word_is_checked() {
        for &(function, index, register) in FEATURE_WORDS {
            let recorded = [CpuidEntry::all_ones(function, index)];
            let missing = lacking(&recorded, &[], &[]);
            assert!(
                missing.len() >= 32,
                "{function:#x}.{index} {register:?}: {missing:?}"
            );
            assert!(lacking(&recorded, &recorded, &[]).is_empty());
        }
        for (function, index, register) in [
            (7, 1, Register::Edx),
            (0x14, 0, Register::Ebx),
            (0x19, 0, Register::Ebx),
            (0x8000_0021, 0, Register::Eax),
        ] {
            assert!(FEATURE_WORDS.contains(&(function, index, register)));
        }
        let listed = |function| HARDWARE_WORDS.iter().any(|(f, ..)| *f == function);
        assert!(listed(0x1d) && listed(0x1e));
        for (i, word) in FEATURE_WORDS.iter().enumerate() {
            assert!(!FEATURE_WORDS[i + 1..].contains(word), "{word:?} twice");
        }
    }

    #[test]
    fn the_hardwares_vendor_xsave_layout_and_amx_geometry_must_match() {
        // PKRU (component 9) at Intel's offset, on a host that puts it at AMD's.
        let intel = [leaf(0xd, 9, 2688, 0, 0), leaf(0x1e, 0, 0x4010, 0, 0)];
        let intel = intel.map(|e| CpuidEntry { eax: 8, ..e });
        let amd = [CpuidEntry {
            eax: 8,
            ..leaf(0xd, 9, 2432, 0, 0)
        }];
        assert_eq!(
            lacking(&intel, &amd, &[]),
            [
                "CPUID leaf 0xd.9 Ebx (XSAVE component offset): recorded 0xa80, this host's 0x980",
                "CPUID leaf 0x1e.0 Ebx (AMX TMUL geometry): recorded 0x4010, this host's none",
            ]
        );
        assert!(lacking(&intel, &intel, &[]).is_empty());
        // "GenuineIntel" on an "AuthenticAMD" host.
        let vendor = |ebx, ecx, edx| CpuidEntry {
            eax: 0xd,
            ..leaf(0, 0, ebx, ecx, edx)
        };
        let genuine_intel = [vendor(0x756e_6547, 0x6c65_746e, 0x4965_6e69)];
        let authentic_amd = [vendor(0x6874_7541, 0x444d_4163, 0x6974_6e65)];
        assert_eq!(
            lacking(&genuine_intel, &authentic_amd, &authentic_amd),
            ["the CPU vendor: recorded GenuineIntel, this host's AuthenticAMD (a trace replays on CPUs of the vendor it was recorded on)"]
        );
        assert!(lacking(&genuine_intel, &[], &authentic_amd).len() == 1);
        assert!(lacking(&genuine_intel, &genuine_intel, &[]).is_empty());
        assert!(lacking(&intel, &[], &intel).is_empty());
        // Subleaves 0 and 1 of leaf 0xd are flags and sizes, not layout.
        let sizes = [leaf(0xd, 0, 0x340, 0, 0), leaf(0xd, 1, 0x340, 0, 0)];
        assert!(lacking(&sizes, &[], &[]).is_empty());
    }

    /// What may differ is exactly the listed fields, each with its reason.
    #[test]
    fn only_the_listed_fields_may_differ() {
        for field in MAY_DIFFER {
            assert!(!field.why.is_empty());
            let index = field.subleaf.unwrap_or(3);
            let recorded = [leaf(field.leaf, index, 0, 0, 0)];
            let mut presented = recorded;
            *presented[0].register_mut(field.register) = field.mask;
            assert!(
                differences(&recorded, &presented).is_empty(),
                "{:#x}",
                field.leaf
            );
            *presented[0].register_mut(field.register) = !field.mask;
            if field.mask != u32::MAX {
                assert_eq!(
                    differences(&recorded, &presented).len(),
                    1,
                    "{:#x}",
                    field.leaf
                );
            }
        }
        let flagged = [CpuidEntry {
            flags: 1,
            ..leaf(4, 0, 0, 0, 0)
        }];
        assert_eq!(
            differences(&[leaf(4, 0, 0, 0, 0)], &flagged),
            ["CPUID leaf 0x4.0 flags: recorded 0x0, presented 0x1"]
        );
    }

    #[test]
    fn identical_tables_match_and_kvm_filled_fields_are_ignored() {
        let recorded = [
            leaf(1, 0, 0x0001_0800, 0, 0),
            leaf(0xb, 1, 0, 0, 0),
            leaf(0xd, 0, 0x240, 0, 0),
        ];
        assert!(differences(&recorded, &recorded).is_empty());
        let presented = [
            // APIC ID 3, OSXSAVE set by the guest's CR4.
            leaf(1, 0, 0x0301_0800, 1 << 27, 0),
            leaf(0xb, 1, 0, 0, 3),
            leaf(0xd, 0, 0x340, 0, 0),
        ];
        assert!(differences(&recorded, &presented).is_empty());
    }

    #[test]
    fn the_model_leaves_out_what_kvm_fills() {
        let on_cpu = |apic: u32| [leaf(1, 0, apic << 24 | 0x0800, 1 << 27 | 1, 0)];
        assert_eq!(model_only(&on_cpu(0)), model_only(&on_cpu(3)));
        assert_eq!(model_only(&on_cpu(3))[0].ebx, 0x0800);
        assert_eq!(model_only(&on_cpu(3))[0].ecx, 1);
    }

    #[test]
    fn differences_name_leaf_register_and_bits() {
        let recorded = [leaf(1, 0, 0, 1 << 13, 0), leaf(4, 1, 0x1c0_003f, 0, 0)];
        let presented = [
            leaf(1, 0, 0, 1 << 13 | 1 << 23, 0),
            leaf(0x8000_0000, 0, 0, 0, 0),
        ];
        assert_eq!(
            differences(&recorded, &presented),
            [
                "CPUID leaf 0x1.0 Ecx: recorded 0x00002000, presented 0x00802000, differing popcnt (bit 23)",
                "CPUID leaf 0x4.1: recorded, not presented here",
                "CPUID leaf 0x80000000.0: presented here, not recorded",
            ]
        );
        // Cache descriptors are compared like everything else.
        let other_cache = [leaf(1, 0, 0, 1 << 13, 0), leaf(4, 1, 0x1c0_007f, 0, 0)];
        assert_eq!(
            differences(&recorded, &other_cache),
            ["CPUID leaf 0x4.1 Ebx: recorded 0x01c0003f, presented 0x01c0007f, differing bit 6"]
        );
    }

    /// On PVM the presented view is this process's host CPU's: a register
    /// that differs is shown the same whichever CPU the process ran on.
    #[test]
    fn a_difference_reads_the_same_on_every_host_cpu() {
        let recorded = [leaf(1, 0, 0x0001_0800, 0, 0)];
        let on_cpu = |apic: u32| [leaf(1, 0, apic << 24 | 0x0002_0800, 0, 0)];
        let shown = differences(&recorded, &on_cpu(0));
        assert_eq!(
            shown,
            ["CPUID leaf 0x1.0 Ebx: recorded 0x00010800, presented 0x00020800, differing bit 16, bit 17"]
        );
        assert_eq!(differences(&recorded, &on_cpu(1)), shown);
    }
}
