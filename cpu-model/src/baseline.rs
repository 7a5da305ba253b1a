//! Named CPU baselines (`provm record --cpu`): a guest CPU model that keeps
//! only the features of an x86-64 microarchitecture level, so that a trace
//! replays on any host at least that capable.
//!
//! A baseline model is built from the host's KVM_GET_SUPPORTED_CPUID: its
//! vendor stays, its feature words keep only the baseline's bits, and what
//! identifies the host is replaced by fixed values, so that two hosts of
//! the same vendor present the same table:
//! - family/model/stepping 15/107/1 (QEMU's `qemu64`, its default model,
//!   which runs on hosts of both vendors; an AMD model below 0x14 would
//!   make Linux drop lahf_lm, K8 erratum 110) and a brand string naming
//!   the baseline;
//! - one cache hierarchy (leaves 2, 4, 0x80000005/6: 32 KiB L1s, 1 MiB L2,
//!   16 MiB L3, 64-byte lines), one processor (no topology leaves 0xb,
//!   0x1f, 0x8000001d/e), 36 physical and 48 virtual address bits (every
//!   x86-64-v2 host has at least that);
//! - no leaf a baseline does not need: basic leaves up to 0xd (0, 1, 2, 4,
//!   7.0, and 0xd.0-2 with x86-64-v3's XSAVE), extended up to 0x80000008.
//!
//! The hidden features of `hidden` are hidden from a baseline too. On PVM no
//! baseline can be presented: guest user space runs natively there and its
//! CPUID instruction returns the host's.

use std::fmt;
use std::str::FromStr;

use crate::entry::{CpuidEntry, Register};
use crate::hidden::{self, Platform};

/// `provm record --cpu`: the host's own model or a named baseline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Baseline {
    /// The host's KVM-supported CPUID minus what provm hides.
    #[default]
    Host,
    X86_64V2,
    X86_64V3,
}

impl Baseline {
    pub const NAMES: [&'static str; 3] = ["host", "x86-64-v2", "x86-64-v3"];

    pub fn name(self) -> &'static str {
        match self {
            Baseline::Host => "host",
            Baseline::X86_64V2 => "x86-64-v2",
            Baseline::X86_64V3 => "x86-64-v3",
        }
    }

    /// The features the guest gets; `None` for the host's own.
    fn features(self) -> Option<impl Iterator<Item = &'static Feature>> {
        let level = match self {
            Baseline::Host => return None,
            Baseline::X86_64V2 => Level::V2,
            Baseline::X86_64V3 => Level::V3,
        };
        Some(FEATURES.iter().filter(move |f| f.level <= level))
    }

    /// The baseline's table made from `supported`, before the hidden
    /// features are taken away and without asking whether the host has
    /// every feature (`guest_model` does both); `None` for the host's own.
    /// What a test sets, to see what KVM presents of a baseline.
    pub fn unchecked_table(self, supported: &[CpuidEntry]) -> Option<Vec<CpuidEntry>> {
        let features: Vec<&Feature> = self.features()?.collect();
        Some(table(supported, &features))
    }
}

impl fmt::Display for Baseline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Baseline {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        [Baseline::Host, Baseline::X86_64V2, Baseline::X86_64V3]
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| format!("no CPU baseline {name:?}: {}", Self::NAMES.join(", ")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error("--cpu {baseline} cannot be presented on PVM: guest user space runs natively there, and the CPUID instruction it executes returns this host's CPUID, not the baseline's{}; record with --cpu host here, or with --cpu {baseline} on a VMX/SVM host", emulator_note(.emulator_lacks))]
    Pvm {
        baseline: Baseline,
        emulator_lacks: Vec<&'static str>,
    },
    #[error("this host cannot offer --cpu {baseline}: its KVM does not support {}", .missing.join(", "))]
    Missing {
        baseline: Baseline,
        missing: Vec<&'static str>,
    },
}

fn emulator_note(lacks: &[&str]) -> String {
    if lacks.is_empty() {
        return String::new();
    }
    format!(
        "; and PVM's ring-0 emulator lacks {}, which the guest kernel would use",
        lacks.join(", ")
    )
}

/// The guest's CPUID for `baseline` on `platform`, from `supported`
/// (KVM_GET_SUPPORTED_CPUID); refused where the baseline cannot be
/// presented or the host lacks part of it.
pub fn guest_model(
    supported: &[CpuidEntry],
    platform: Platform,
    baseline: Baseline,
) -> Result<Vec<CpuidEntry>, BaselineError> {
    let Some(features) = baseline.features() else {
        return Ok(hidden::guest_cpuid(supported, platform));
    };
    let features: Vec<&Feature> = features.collect();
    if platform == Platform::Pvm {
        let emulator_lacks = features
            .iter()
            .filter(|f| {
                hidden::EMULATOR_HOLES
                    .iter()
                    .any(|hole| f.is(hole.leaf, hole.subleaf, hole.register, hole.bit))
            })
            .map(|f| f.name)
            .collect();
        return Err(BaselineError::Pvm {
            baseline,
            emulator_lacks,
        });
    }
    let missing: Vec<&'static str> = features
        .iter()
        .filter(|f| word(supported, f.leaf, f.subleaf, f.register) & (1 << f.bit) == 0)
        .map(|f| f.name)
        .collect();
    if !missing.is_empty() {
        return Err(BaselineError::Missing { baseline, missing });
    }
    Ok(hidden::guest_cpuid(&table(supported, &features), platform))
}

/// Linux's name for a feature bit, where provm knows it: one it hides
/// (`hidden`), or one a baseline names.
pub fn feature_name(leaf: u32, subleaf: u32, register: Register, bit: u8) -> Option<&'static str> {
    hidden::hidden_feature_name(leaf, subleaf, register, bit).or_else(|| {
        FEATURES
            .iter()
            .find(|f| f.is(leaf, subleaf, register, bit))
            .map(|f| f.name)
    })
}

fn word(table: &[CpuidEntry], leaf: u32, subleaf: u32, register: Register) -> u32 {
    table
        .iter()
        .find(|e| e.function == leaf && e.index == subleaf)
        .map_or(0, |e| e.register(register))
}

/// KVM's flag for leaves whose subleaf (ECX) selects the entry.
const SIGNIFICANT_INDEX: u32 = 1;
/// Family 15, model 107 (extended model 6, model 0xb), stepping 1: QEMU's
/// `qemu64`.
const SIGNATURE: u32 = 0x0006_0fb1;
/// x87, SSE and AVX state: what x86-64-v3's XSAVE manages.
const XCR0_AVX: u32 = 0b111;
/// The XSAVE area for x87, SSE and AVX: 512 legacy + 64 header + 256.
const XSAVE_AVX_BYTES: u32 = 832;

/// The baseline's table: `supported` reduced to `features` and to the
/// leaves a baseline keeps, with the host's identity replaced.
fn table(supported: &[CpuidEntry], features: &[&Feature]) -> Vec<CpuidEntry> {
    let xsave = features.iter().any(|f| f.name == "xsave");
    let mask = |leaf, subleaf, register| {
        features
            .iter()
            .filter(|f| (f.leaf, f.subleaf, f.register) == (leaf, subleaf, register))
            .fold(0u32, |mask, f| mask | 1 << f.bit)
    };
    let features_of = |leaf: u32, subleaf: u32| {
        let supported = |register| word(supported, leaf, subleaf, register);
        let [eax, ebx, ecx, edx] = [Register::Eax, Register::Ebx, Register::Ecx, Register::Edx]
            .map(|register| supported(register) & mask(leaf, subleaf, register));
        (eax, ebx, ecx, edx)
    };
    let vendor = word(supported, 0, 0, Register::Ebx);
    let (_, _, ecx1, edx1) = features_of(1, 0);
    let (_, ebx7, ecx7, edx7) = features_of(7, 0);
    let (_, _, ecx_ext, edx_ext) = features_of(0x8000_0001, 0);
    let mut table = vec![
        leaf(
            0,
            0,
            [
                0xd,
                vendor,
                word(supported, 0, 0, Register::Ecx),
                word(supported, 0, 0, Register::Edx),
            ],
        ),
        // EBX: a 64-byte CLFLUSH line (8 quadwords), one logical processor.
        leaf(1, 0, [SIGNATURE, 0x0001_0800, ecx1, edx1]),
        // One descriptor, 0xff: "see leaf 4".
        leaf(2, 0, [1, 0, 0, 0xff]),
    ];
    table.extend(CACHES.iter().enumerate().map(|(i, cache)| CpuidEntry {
        flags: SIGNIFICANT_INDEX,
        ..leaf(4, i as u32, cache.leaf_4())
    }));
    table.push(CpuidEntry {
        flags: SIGNIFICANT_INDEX,
        ..leaf(7, 0, [0, ebx7, ecx7, edx7])
    });
    if xsave {
        let avx = supported
            .iter()
            .find(|e| (e.function, e.index) == (0xd, 2))
            .map_or([256, 576, 0, 0], |e| [e.eax, e.ebx, e.ecx, e.edx]);
        let xcr0 = word(supported, 0xd, 0, Register::Eax) & XCR0_AVX;
        for (index, registers) in [
            (0, [xcr0, XSAVE_AVX_BYTES, XSAVE_AVX_BYTES, 0]),
            // No XSAVEOPT, XSAVEC, XGETBV1 or XSAVES, no supervisor state.
            (1, [0; 4]),
            // The AVX component's size and offset: the hardware's own.
            (2, avx),
        ] {
            table.push(CpuidEntry {
                flags: SIGNIFICANT_INDEX,
                ..leaf(0xd, index, registers)
            });
        }
    }
    let brand = brand_string(features);
    table.extend([
        leaf(
            0x8000_0000,
            0,
            [
                0x8000_0008,
                word(supported, 0x8000_0000, 0, Register::Ebx),
                word(supported, 0x8000_0000, 0, Register::Ecx),
                word(supported, 0x8000_0000, 0, Register::Edx),
            ],
        ),
        leaf(0x8000_0001, 0, [SIGNATURE, 0, ecx_ext, edx_ext]),
        leaf(0x8000_0002, 0, brand[0]),
        leaf(0x8000_0003, 0, brand[1]),
        leaf(0x8000_0004, 0, brand[2]),
        leaf(0x8000_0005, 0, amd_l1()),
        leaf(0x8000_0006, 0, amd_l2_l3()),
        // 36 physical, 48 virtual address bits; one core.
        leaf(0x8000_0008, 0, [0x3024, 0, 0, 0]),
    ]);
    table
}

fn leaf(function: u32, index: u32, [eax, ebx, ecx, edx]: [u32; 4]) -> CpuidEntry {
    CpuidEntry {
        function,
        index,
        flags: 0,
        eax,
        ebx,
        ecx,
        edx,
    }
}

/// "provm x86-64-v2" etc., NUL-padded, as leaves 0x80000002-4 hold it.
fn brand_string(features: &[&Feature]) -> [[u32; 4]; 3] {
    let level = if features.iter().any(|f| f.level == Level::V3) {
        Baseline::X86_64V3
    } else {
        Baseline::X86_64V2
    };
    let mut bytes = [0u8; 48];
    let name = format!("provm {level}");
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    let mut words = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")));
    [(); 3].map(|_| [(); 4].map(|_| words.next().expect("12 words")))
}

/// One cache of the baseline's fixed hierarchy (leaf 4's terms).
struct Cache {
    /// 1 data, 2 instruction, 3 unified; 0 ends the list.
    kind: u32,
    level: u32,
    ways: u32,
    sets: u32,
}

const LINE: u32 = 64;

const CACHES: [Cache; 5] = [
    // 32 KiB L1 data and instruction caches, 8-way.
    Cache {
        kind: 1,
        level: 1,
        ways: 8,
        sets: 64,
    },
    Cache {
        kind: 2,
        level: 1,
        ways: 8,
        sets: 64,
    },
    // 1 MiB L2, 16-way.
    Cache {
        kind: 3,
        level: 2,
        ways: 16,
        sets: 1024,
    },
    // 16 MiB L3, 16-way.
    Cache {
        kind: 3,
        level: 3,
        ways: 16,
        sets: 16384,
    },
    Cache {
        kind: 0,
        level: 0,
        ways: 0,
        sets: 0,
    },
];

impl Cache {
    fn leaf_4(&self) -> [u32; 4] {
        if self.kind == 0 {
            return [0; 4];
        }
        // EAX: self-initializing (bit 8); one thread and one core share it.
        let eax = self.kind | self.level << 5 | 1 << 8;
        let ebx = (self.ways - 1) << 22 | (LINE - 1);
        [eax, ebx, self.sets - 1, 0]
    }

    fn kib(&self) -> u32 {
        self.ways * self.sets * LINE / 1024
    }
}

/// Leaf 0x80000005 (AMD's L1 caches and TLBs): the L1s of `CACHES`.
fn amd_l1() -> [u32; 4] {
    let l1 = |cache: &Cache| cache.kib() << 24 | cache.ways << 16 | 1 << 8 | LINE;
    // 255-entry, 1-way TLBs for 2M/4M and 4K pages.
    let tlb = 0x01ff_01ff;
    [tlb, tlb, l1(&CACHES[0]), l1(&CACHES[1])]
}

/// Leaf 0x80000006: the L2 (ECX, both vendors) and L3 (EDX, AMD) of
/// `CACHES`; 0x8 is AMD's code for 16-way.
fn amd_l2_l3() -> [u32; 4] {
    let (l2, l3) = (&CACHES[2], &CACHES[3]);
    let ecx = l2.kib() << 16 | 0x8 << 12 | 1 << 8 | LINE;
    let edx = (l3.kib() / 512) << 18 | 0x8 << 12 | 1 << 8 | LINE;
    [0, 0, ecx, edx]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    /// The x86-64 base every 64-bit host has (psABI's baseline plus what
    /// Linux expects of a 64-bit CPU).
    Base,
    V2,
    V3,
}

/// One feature bit of a baseline, by Linux's name (/proc/cpuinfo).
struct Feature {
    name: &'static str,
    leaf: u32,
    subleaf: u32,
    register: Register,
    bit: u8,
    level: Level,
}

impl Feature {
    fn is(&self, leaf: u32, subleaf: u32, register: Register, bit: u8) -> bool {
        (self.leaf, self.subleaf, self.register, self.bit) == (leaf, subleaf, register, bit)
    }
}

const fn feature(
    name: &'static str,
    leaf: u32,
    register: Register,
    bit: u8,
    level: Level,
) -> Feature {
    Feature {
        name,
        leaf,
        subleaf: 0,
        register,
        bit,
        level,
    }
}

use Level::{Base, V2, V3};
use Register::{Ebx, Ecx, Edx};

/// Every feature a baseline offers. The TSC, APIC and machine-check bits a
/// 64-bit CPU also has are hidden on every host (`hidden::DETERMINISM`), and
/// OSXSAVE follows the guest's CR4.
const FEATURES: &[Feature] = &[
    feature("fpu", 1, Edx, 0, Base),
    // No VME: virtual-8086 mode means nothing to a 64-bit guest, and KVM on
    // SVM with nested paging does not offer it (seen on the test bed).
    feature("de", 1, Edx, 2, Base),
    feature("pse", 1, Edx, 3, Base),
    feature("msr", 1, Edx, 5, Base),
    feature("pae", 1, Edx, 6, Base),
    feature("cx8", 1, Edx, 8, Base),
    feature("sep", 1, Edx, 11, Base),
    feature("mtrr", 1, Edx, 12, Base),
    feature("pge", 1, Edx, 13, Base),
    feature("cmov", 1, Edx, 15, Base),
    feature("pat", 1, Edx, 16, Base),
    feature("pse36", 1, Edx, 17, Base),
    feature("clflush", 1, Edx, 19, Base),
    feature("mmx", 1, Edx, 23, Base),
    feature("fxsr", 1, Edx, 24, Base),
    feature("sse", 1, Edx, 25, Base),
    feature("sse2", 1, Edx, 26, Base),
    feature("syscall", 0x8000_0001, Edx, 11, Base),
    feature("nx", 0x8000_0001, Edx, 20, Base),
    feature("lm", 0x8000_0001, Edx, 29, Base),
    // Linux calls SSE3 "pni".
    feature("pni", 1, Ecx, 0, V2),
    feature("ssse3", 1, Ecx, 9, V2),
    feature("cx16", 1, Ecx, 13, V2),
    feature("sse4_1", 1, Ecx, 19, V2),
    feature("sse4_2", 1, Ecx, 20, V2),
    feature("popcnt", 1, Ecx, 23, V2),
    feature("lahf_lm", 0x8000_0001, Ecx, 0, V2),
    feature("fma", 1, Ecx, 12, V3),
    feature("movbe", 1, Ecx, 22, V3),
    feature("xsave", 1, Ecx, 26, V3),
    feature("avx", 1, Ecx, 28, V3),
    feature("f16c", 1, Ecx, 29, V3),
    feature("bmi1", 7, Ebx, 3, V3),
    feature("avx2", 7, Ebx, 5, V3),
    feature("bmi2", 7, Ebx, 8, V3),
    // LZCNT.
    feature("abm", 0x8000_0001, Ecx, 5, V3),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check;

    /// A KVM-supported table of an Intel host with every feature bit set,
    /// and `identity` in its family/model, brand, caches and topology.
    fn intel_host(identity: u32) -> Vec<CpuidEntry> {
        let all = u32::MAX;
        vec![
            leaf(0, 0, [0x1f, 0x756e_6547, 0x6c65_746e, 0x4965_6e69]),
            leaf(1, 0, [identity, identity, all, all]),
            leaf(2, 0, [identity, identity, 0, 0]),
            leaf(4, 0, [identity | 0x21, identity, identity, 0]),
            leaf(7, 0, [2, all, all, all]),
            leaf(7, 1, [all, 0, 0, all]),
            leaf(0xb, 0, [identity, identity, identity, 0]),
            leaf(0xd, 0, [0x2ff, 0xa88, 0xa88, 0]),
            leaf(0xd, 1, [0xf, 0xa88, 0x100, 0]),
            leaf(0xd, 2, [256, 576, 0, 0]),
            leaf(0xd, 5, [64, 832, 0, 0]),
            leaf(0x14, 0, [1, all, all, 0]),
            leaf(0x8000_0000, 0, [0x8000_0021, 0, 0, 0]),
            leaf(0x8000_0001, 0, [0, 0, all, all]),
            leaf(0x8000_0002, 0, [identity; 4]),
            leaf(0x8000_0006, 0, [0, 0, identity, 0]),
            leaf(0x8000_0008, 0, [0x3027 + identity, all, 0, 0]),
            leaf(0x8000_000a, 0, [1, 8, 0, all]),
            leaf(0x8000_0021, 0, [all, 0, all, 0]),
        ]
    }

    fn has(table: &[CpuidEntry], name: &str) -> bool {
        let feature = FEATURES.iter().find(|f| f.name == name).unwrap();
        word(table, feature.leaf, feature.subleaf, feature.register) & (1 << feature.bit) != 0
    }

    #[test]
    fn names_parse_and_print() {
        for name in Baseline::NAMES {
            assert_eq!(name.parse::<Baseline>().unwrap().to_string(), name);
        }
        assert_eq!(Baseline::default(), Baseline::Host);
        let refused = "x86-64-v4".parse::<Baseline>().unwrap_err();
        assert!(refused.contains("host, x86-64-v2, x86-64-v3"), "{refused}");
    }

    #[test]
    fn host_is_the_hosts_own_model() {
        let host = intel_host(0x906ea);
        for platform in [Platform::Pvm, Platform::Hardware] {
            assert_eq!(
                guest_model(&host, platform, Baseline::Host).unwrap(),
                hidden::guest_cpuid(&host, platform)
            );
        }
    }

    /// Two hosts of one vendor that differ in model, caches, topology,
    /// address width and extra features present the same baseline table,
    /// which keeps exactly the baseline's features.
    #[test]
    fn two_hosts_of_a_vendor_present_the_same_baseline() {
        for baseline in [Baseline::X86_64V2, Baseline::X86_64V3] {
            let first = guest_model(&intel_host(0x506e3), Platform::Hardware, baseline).unwrap();
            let second = guest_model(&intel_host(0xa0671), Platform::Hardware, baseline).unwrap();
            assert_eq!(first, second, "{baseline}");
            let offered: Vec<&str> = baseline.features().unwrap().map(|f| f.name).collect();
            for feature in FEATURES {
                assert_eq!(
                    has(&first, feature.name),
                    offered.contains(&feature.name),
                    "{baseline}: {}",
                    feature.name
                );
            }
            // No other bit of a feature word survives.
            let bits =
                |leaf, subleaf, register| (word(&first, leaf, subleaf, register)).count_ones();
            let offered_in = |leaf, register| {
                baseline
                    .features()
                    .unwrap()
                    .filter(|f| (f.leaf, f.register) == (leaf, register))
                    .count() as u32
            };
            for (leaf, register) in [
                (1, Ecx),
                (1, Edx),
                (7, Ebx),
                (0x8000_0001, Ecx),
                (0x8000_0001, Edx),
            ] {
                assert_eq!(
                    bits(leaf, 0, register),
                    offered_in(leaf, register),
                    "{leaf:#x} {register:?}"
                );
            }
            assert_eq!(word(&first, 7, 0, Ecx) | word(&first, 7, 0, Edx), 0);
            assert_eq!(word(&first, 0x8000_0008, 0, Ebx), 0);
        }
    }

    #[test]
    fn a_baseline_keeps_only_the_leaves_it_needs() {
        let leaves = |baseline| -> Vec<(u32, u32)> {
            guest_model(&intel_host(0x906ea), Platform::Hardware, baseline)
                .unwrap()
                .iter()
                .map(|e| (e.function, e.index))
                .collect()
        };
        let basic_v2 = [
            (0, 0),
            (1, 0),
            (2, 0),
            (4, 0),
            (4, 1),
            (4, 2),
            (4, 3),
            (4, 4),
            (7, 0),
        ];
        let extended: Vec<(u32, u32)> = (0x8000_0000..=0x8000_0008)
            .filter(|&f| f != 0x8000_0007)
            .map(|f| (f, 0))
            .collect();
        assert_eq!(
            leaves(Baseline::X86_64V2),
            [&basic_v2[..], &extended].concat()
        );
        let basic_v3 = [&basic_v2[..], &[(0xd, 0), (0xd, 1), (0xd, 2)]].concat();
        assert_eq!(
            leaves(Baseline::X86_64V3),
            [&basic_v3[..], &extended].concat()
        );

        let v3 = guest_model(&intel_host(0x906ea), Platform::Hardware, Baseline::X86_64V3).unwrap();
        let find = |function, index| {
            *v3.iter()
                .find(|e| (e.function, e.index) == (function, index))
                .unwrap()
        };
        // XSAVE manages x87, SSE and AVX only, in the hardware's layout.
        assert_eq!(find(0xd, 0).eax, 0b111);
        assert_eq!((find(0xd, 2).eax, find(0xd, 2).ebx), (256, 576));
        assert_eq!(find(0, 0).eax, 0xd);
        assert_eq!(find(0x8000_0000, 0).eax, 0x8000_0008);
        assert_eq!(find(1, 0).eax, SIGNATURE);
        let (family, model) = (
            (SIGNATURE >> 8) & 0xf,
            (SIGNATURE >> 12) & 0xf0 | (SIGNATURE >> 4) & 0xf,
        );
        assert_eq!((family, model, SIGNATURE & 0xf), (15, 107, 1));
        let brand: Vec<u8> = (0x8000_0002..=0x8000_0004)
            .flat_map(|f| {
                let e = find(f, 0);
                [e.eax, e.ebx, e.ecx, e.edx]
                    .into_iter()
                    .flat_map(u32::to_le_bytes)
            })
            .collect();
        assert!(brand.starts_with(b"provm x86-64-v3\0"), "{brand:?}");
        // Leaf 4 lists L1d, L1i, L2, L3 (32K, 32K, 1M, 16M), then ends.
        let sizes: Vec<u32> = (0..5)
            .map(|i| {
                let e = find(4, i);
                ((e.ebx >> 22) + 1)
                    * ((e.ebx & 0xfff) + 1)
                    * (e.ecx + 1)
                    * u32::from(e.eax & 0x1f != 0)
            })
            .collect();
        assert_eq!(sizes, [32 << 10, 32 << 10, 1 << 20, 16 << 20, 0]);
    }

    /// What a baseline recording holds, a host that can offer the baseline
    /// passes the replay's feature check for.
    #[test]
    fn a_baseline_table_passes_the_replay_check_of_a_capable_host() {
        let recorded =
            guest_model(&intel_host(0x506e3), Platform::Hardware, Baseline::X86_64V3).unwrap();
        let other = intel_host(0xa0671);
        let lacking = check::lacking(&recorded, &other, &other);
        assert!(lacking.is_empty(), "{lacking:?}");
    }

    #[test]
    fn a_host_without_the_baseline_is_refused_by_feature_name() {
        let mut host = intel_host(0x206a7);
        host.iter_mut().find(|e| e.function == 7).unwrap().ebx = 0;
        host.iter_mut().find(|e| e.function == 1).unwrap().ecx &= !(1 << 22);
        assert!(guest_model(&host, Platform::Hardware, Baseline::X86_64V2).is_ok());
        let refused = guest_model(&host, Platform::Hardware, Baseline::X86_64V3)
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "this host cannot offer --cpu x86-64-v3: its KVM does not support movbe, bmi1, avx2, bmi2"
        );
    }

    /// PVM cannot present a baseline to guest user space, and its emulator
    /// lacks part of each baseline: both are said.
    #[test]
    fn pvm_refuses_every_baseline_saying_why() {
        let host = intel_host(0x906ea);
        let v2 = guest_model(&host, Platform::Pvm, Baseline::X86_64V2)
            .unwrap_err()
            .to_string();
        assert!(v2.contains("guest user space runs natively"), "{v2}");
        assert!(v2.contains("returns this host's CPUID"), "{v2}");
        assert!(v2.contains("emulator lacks cx16, popcnt,"), "{v2}");
        let v3 = guest_model(&host, Platform::Pvm, Baseline::X86_64V3)
            .unwrap_err()
            .to_string();
        assert!(
            v3.contains("cx16, popcnt, fma, movbe, xsave, avx, f16c, bmi1, avx2, bmi2, abm"),
            "{v3}"
        );
    }

    #[test]
    fn baseline_feature_names_are_unique_and_named_in_errors() {
        for (i, a) in FEATURES.iter().enumerate() {
            assert!(a.bit < 32);
            for b in &FEATURES[i + 1..] {
                assert!(!a.is(b.leaf, b.subleaf, b.register, b.bit), "{}", a.name);
                assert_ne!(a.name, b.name);
            }
        }
        assert_eq!(feature_name(1, 0, Ecx, 0), Some("pni"));
        assert_eq!(feature_name(0x8000_0001, 0, Edx, 29), Some("lm"));
    }
}
