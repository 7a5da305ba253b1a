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
//! vCPU (`KVM_FILLED`). Everything else is compared exactly, including the
//! cache and TLB descriptors of leaves 2 and 4 and the vendor, family and
//! model: KVM presents them as set, so they differ only where the host
//! replaces the table (PVM), and there a guest that reads them (glibc sizes
//! its memcpy thresholds from leaf 4) could behave differently.

use crate::cpuid::{feature_name, CpuidEntry, Register};

/// The words of feature flags: a recorded bit set in one of these must be
/// supported by the replaying host's KVM.
const FEATURE_WORDS: &[(u32, u32, Register)] = &[
    (1, 0, Register::Ecx),
    (1, 0, Register::Edx),
    (7, 0, Register::Ebx),
    (7, 0, Register::Ecx),
    (7, 0, Register::Edx),
    (7, 1, Register::Eax),
    (0xd, 1, Register::Eax),
    (0x8000_0001, 0, Register::Ecx),
    (0x8000_0001, 0, Register::Edx),
    (0x8000_0008, 0, Register::Ebx),
];

/// A field KVM fills itself, which may differ between two vCPUs of the same
/// model: `leaf` (any subleaf when `subleaf` is None), `register`, `mask`.
struct Filled {
    leaf: u32,
    subleaf: Option<u32>,
    register: Register,
    mask: u32,
}

const KVM_FILLED: &[Filled] = &[
    // Initial APIC ID, EBX[31:24]: per vCPU (and per host CPU on PVM).
    Filled {
        leaf: 1,
        subleaf: None,
        register: Register::Ebx,
        mask: 0xff00_0000,
    },
    // OSXSAVE follows the guest's CR4.OSXSAVE at run time.
    Filled {
        leaf: 1,
        subleaf: None,
        register: Register::Ecx,
        mask: 1 << 27,
    },
    // OSPKE follows the guest's CR4.PKE at run time.
    Filled {
        leaf: 7,
        subleaf: Some(0),
        register: Register::Ecx,
        mask: 1 << 4,
    },
    // x2APIC ID of the extended topology leaves: per vCPU.
    Filled {
        leaf: 0xb,
        subleaf: None,
        register: Register::Edx,
        mask: u32::MAX,
    },
    Filled {
        leaf: 0x1f,
        subleaf: None,
        register: Register::Edx,
        mask: u32::MAX,
    },
    // XSAVE area size for the current XCR0 / XSS: follows the guest.
    Filled {
        leaf: 0xd,
        subleaf: Some(0),
        register: Register::Ebx,
        mask: u32::MAX,
    },
    Filled {
        leaf: 0xd,
        subleaf: Some(1),
        register: Register::Ebx,
        mask: u32::MAX,
    },
];

const REGISTERS: [Register; 4] = [Register::Eax, Register::Ebx, Register::Ecx, Register::Edx];

/// The bits of `register` in `entry` that KVM fills itself.
fn filled_mask(entry: &CpuidEntry, register: Register) -> u32 {
    KVM_FILLED
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
/// knows the name, else by leaf, register and bit.
pub fn lacking(
    recorded: &[CpuidEntry],
    supported: &[CpuidEntry],
    presented: &[CpuidEntry],
) -> Vec<String> {
    let mut missing = Vec::new();
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
    missing
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
        for register in REGISTERS {
            let (was, is) = (entry.register(register), here.register(register));
            let differ = (was ^ is) & !filled_mask(entry, register);
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
}
