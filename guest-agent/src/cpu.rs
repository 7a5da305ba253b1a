//! Detects vector register state that user space may use but the guest
//! kernel does not save, and keeps the libraries that can be told to out
//! of it.
//!
//! Under some hypervisors (PVM) guest user mode runs natively with the
//! host's CPUID and XCR0, AVX and AVX-512 enabled, while the guest kernel
//! was told there is no XSAVE and saves only the legacy FXSAVE area (x87 and
//! SSE) at context switches. The upper halves of the YMM/ZMM registers and
//! the mask registers then leak between processes: glibc's AVX string
//! functions (memcpy, ...) corrupt data as soon as two processes share a CPU.
//! Under a normal VMX/SVM host this cannot happen: the guest kernel manages
//! XSAVE, or CPUID hides AVX.

use std::arch::asm;
use std::arch::x86_64::{__cpuid, __cpuid_count};

/// CPUID.1:ECX.OSXSAVE: the kernel set CR4.OSXSAVE, so `xgetbv` works.
const OSXSAVE: u32 = 1 << 27;

/// XCR0's x87 and SSE bits: the state FXSAVE saves.
const X87_SSE: u64 = 0b11;

/// The environment entries given to commands when the vector state is not
/// managed, besides numpy's (see [`library_switches`]): each keeps one
/// library that chooses its code by CPUID on x87 and SSE registers, which
/// the kernel's FXSAVE does save. A variable the user set is left alone.
/// Each library here accepts every name in its entry on every CPU, silently.
const FIXED_SWITCHES: &[&str] = &[
    // glibc 2.36's string functions. Each name is one that glibc's
    // `glibc.cpu.hwcaps` parser knows (sysdeps/x86/cpu-tunables.c); checked
    // with `ld.so --list-diagnostics`, whose active CPU feature bits change
    // for each. Without -AVX_Fast_Unaligned_Load bookworm's memcpy still
    // used VEX instructions. ERMS and FSRM (`rep movsb`) use no vector state.
    "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX_Fast_Unaligned_Load",
    // OpenSSL (OPENSSL_ia32cap(3)): `~` clears bits. First word, CPUID.1
    // (EDX low, ECX high): XOP #43, OSXSAVE #59, AVX #60, and RDRAND #62,
    // whose unlogged randomness a replay cannot reproduce. Second word,
    // CPUID.7.0 (EBX low, ECX high): AVX2 #5, AVX512F #16, AVX512DQ #17,
    // RDSEED #18, AVX512IFMA #21, AVX512BW #30, AVX512VL #31, VAES #41,
    // VPCLMULQDQ #42. Checked with `openssl info -cpusettings`.
    "OPENSSL_ia32cap=~0x5800080000000000:~0x600c0270020",
    // OpenBLAS built with DYNAMIC_ARCH (Debian's is): Nehalem's kernels are
    // SSE only.
    "OPENBLAS_CORETYPE=Nehalem",
    // Intel oneMKL: dispatch no further than SSE4.2.
    "MKL_ENABLE_INSTRUCTIONS=SSE4_2",
];

/// numpy's runtime dispatch targets that use AVX or AVX-512 state, by their
/// numpy 1.x names, each with the test numpy makes of the CPU before it
/// counts the target as supported (`npy__cpu_init_features`,
/// numpy/core/src/common/npy_cpu_features.c).
///
/// numpy 1.x prints a RuntimeWarning at every import for each name in
/// NPY_DISABLE_CPU_FEATURES that its build does not dispatch or the CPU
/// lacks; numpy 2.x only raises an ImportWarning (hidden by default) or
/// says nothing. So the variable names only targets this CPU has, and only
/// these ten, which Debian 12's numpy 1.24 dispatches (and pip's builds of
/// 1.x and 2.0-2.3 too). Left out: AVX512_KNL and AVX512_KNM (Xeon Phi
/// only, not dispatched by Debian's build), AVX512_SPR (unknown to 1.24),
/// and the X86_V3 and X86_V4 of numpy 2.4 on (unknown to every 1.x): a
/// numpy that dispatches by those still picks AVX code here, like the
/// other libraries that read CPUID themselves.
const NUMPY_TARGETS: &[(&str, HasTarget)] = &[
    ("AVX", |cpu| cpu.avx()),
    ("F16C", |cpu| cpu.leaf1_ecx & (1 << 29) != 0),
    ("FMA3", |cpu| cpu.avx() && cpu.leaf1_ecx & (1 << 12) != 0),
    ("AVX2", |cpu| cpu.avx2()),
    ("AVX512F", |cpu| cpu.avx512(&[(EBX, 16)])),
    ("AVX512CD", |cpu| cpu.avx512(&[(EBX, 28)])),
    ("AVX512_SKX", |cpu| cpu.avx512_skx()),
    ("AVX512_CLX", |cpu| cpu.avx512_clx()),
    ("AVX512_CNL", |cpu| cpu.avx512_cnl()),
    ("AVX512_ICL", |cpu| {
        cpu.avx512_clx() && cpu.avx512_cnl() && cpu.avx512(&[(ECX, 6), (ECX, 12), (ECX, 14)])
    }),
];

/// Whether a CPU has one of numpy's targets.
type HasTarget = fn(&CpuFeatures) -> bool;

/// Registers of CPUID leaf 7, by their place in [`CpuFeatures::leaf7`].
const EBX: usize = 0;
const ECX: usize = 1;

/// What numpy reads of the CPU to choose its code.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuFeatures {
    pub leaf1_ecx: u32,
    /// CPUID leaf 7, subleaf 0: EBX, ECX.
    pub leaf7: [u32; 2],
    pub xcr0: u64,
}

impl CpuFeatures {
    /// This CPU's, given its XCR0.
    pub fn of_this_cpu(xcr0: u64) -> Self {
        let leaf7 = __cpuid_count(7, 0);
        CpuFeatures {
            leaf1_ecx: __cpuid(1).ecx,
            leaf7: [leaf7.ebx, leaf7.ecx],
            xcr0,
        }
    }

    fn avx(&self) -> bool {
        self.leaf1_ecx & OSXSAVE != 0
            && self.xcr0 & 0b110 == 0b110
            && self.leaf1_ecx & (1 << 28) != 0
    }

    fn avx2(&self) -> bool {
        self.avx() && self.leaf7[EBX] & (1 << 5) != 0
    }

    /// AVX2 and the OS's AVX-512 state, and every leaf-7 bit in `bits`.
    /// numpy looks at any AVX-512 target only when F and CD are both there.
    fn avx512(&self, bits: &[(usize, u32)]) -> bool {
        let foundation = [(EBX, 16), (EBX, 28)];
        self.avx2()
            && self.xcr0 & 0xe6 == 0xe6
            && foundation
                .iter()
                .chain(bits)
                .all(|&(register, bit)| self.leaf7[register] & (1 << bit) != 0)
    }

    fn avx512_skx(&self) -> bool {
        self.avx512(&[(EBX, 17), (EBX, 30), (EBX, 31)])
    }

    fn avx512_clx(&self) -> bool {
        self.avx512_skx() && self.avx512(&[(ECX, 11)])
    }

    fn avx512_cnl(&self) -> bool {
        self.avx512_skx() && self.avx512(&[(EBX, 21), (ECX, 1)])
    }
}

/// The environment entries given to commands when the vector state is not
/// managed, on a CPU with `cpu`'s features: [`FIXED_SWITCHES`], and numpy's
/// targets this CPU has (none: no entry).
pub fn library_switches(cpu: &CpuFeatures) -> Vec<String> {
    let numpy: Vec<&str> = NUMPY_TARGETS
        .iter()
        .filter(|(_, has)| has(cpu))
        .map(|(name, _)| *name)
        .collect();
    let mut switches: Vec<String> = FIXED_SWITCHES.iter().map(|s| s.to_string()).collect();
    if !numpy.is_empty() {
        switches.push(format!("NPY_DISABLE_CPU_FEATURES={}", numpy.join(" ")));
    }
    switches
}

/// XCR0 when user space may use vector state beyond x87 and SSE that the
/// guest kernel does not save across context switches; `None` otherwise.
/// `cpuinfo` is the text of /proc/cpuinfo.
pub fn unmanaged_vector_state(cpuinfo: &str) -> Option<u64> {
    let leaf1 = __cpuid(1);
    if leaf1.ecx & OSXSAVE == 0 {
        return None;
    }
    // SAFETY: OSXSAVE is set, so XGETBV is enabled.
    let xcr0 = unsafe { xgetbv0() };
    (beyond_sse(xcr0) && !kernel_manages_xsave(cpuinfo)).then_some(xcr0)
}

/// Reads XCR0. The caller makes sure CPUID.1:ECX.OSXSAVE is set.
unsafe fn xgetbv0() -> u64 {
    let (low, high): (u32, u32);
    // SAFETY: the caller checked XGETBV is enabled; it only reads XCR0.
    unsafe {
        asm!("xgetbv", in("ecx") 0, out("eax") low, out("edx") high,
             options(nomem, nostack, preserves_flags));
    }
    u64::from(high) << 32 | u64::from(low)
}

/// Whether XCR0 enables state other than x87 and SSE (AVX, AVX-512, ...).
fn beyond_sse(xcr0: u64) -> bool {
    xcr0 & !X87_SSE != 0
}

/// Whether the kernel uses XSAVE, so saves every state XCR0 enables: the
/// word `xsave` in the flags line of /proc/cpuinfo.
fn kernel_manages_xsave(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| key.trim() == "flags")
        .any(|(_, flags)| flags.split_whitespace().any(|flag| flag == "xsave"))
}

/// Adds `switches` (see [`library_switches`]) to a command's environment
/// `env` (`KEY=VALUE` entries), each unless `env` sets its variable
/// already: the user's choice.
pub fn add_library_switches(env: &mut Vec<Vec<u8>>, switches: &[String]) {
    for switch in switches {
        let (key, _) = switch.split_once('=').expect("KEY=VALUE");
        let sets_key = |entry: &Vec<u8>| {
            entry
                .strip_prefix(key.as_bytes())
                .is_some_and(|rest| rest.starts_with(b"="))
        };
        if !env.iter().any(sets_key) {
            env.push(switch.as_bytes().to_vec());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_beyond_x87_and_sse_is_detected() {
        assert!(!beyond_sse(0x1));
        assert!(!beyond_sse(0x3));
        assert!(beyond_sse(0x7));
        assert!(beyond_sse(0xe7));
        assert!(beyond_sse(0x2_0000_0003));
    }

    #[test]
    fn the_flags_line_says_whether_the_kernel_uses_xsave() {
        let cpuinfo = |flags: &str| {
            format!("processor\t: 0\nmodel name\t: xsave CPU\nflags\t\t: {flags}\nbugs\t\t: \n")
        };
        assert!(kernel_manages_xsave(&cpuinfo("fpu sse sse2 xsave avx")));
        assert!(kernel_manages_xsave(&cpuinfo("xsave")));
        assert!(!kernel_manages_xsave(&cpuinfo(
            "fpu sse sse2 xsaveopt xsaves"
        )));
        assert!(!kernel_manages_xsave(&cpuinfo("fpu sse sse2")));
        assert!(!kernel_manages_xsave(""));
    }

    #[test]
    fn a_kernel_using_xsave_manages_the_state() {
        // Runs CPUID and XGETBV on this CPU, whatever its XCR0.
        assert_eq!(unmanaged_vector_state("flags\t: fpu xsave\n"), None);
    }

    /// The development machines' CPU (an AMD EPYC with AVX-512 up to
    /// numpy's ICL group, no Xeon Phi or Sapphire Rapids parts), with the
    /// XCR0 PVM gives guest user space.
    fn epyc() -> CpuFeatures {
        CpuFeatures {
            leaf1_ecx: 0xfffa_3203,
            leaf7: [0xf1bf_07ab, 0x0040_5fc6],
            xcr0: 0xe7,
        }
    }

    fn numpy_entry(cpu: &CpuFeatures) -> Option<String> {
        library_switches(cpu).into_iter().find_map(|entry| {
            entry
                .strip_prefix("NPY_DISABLE_CPU_FEATURES=")
                .map(str::to_owned)
        })
    }

    /// numpy 1.24 warns at every import about a name its build does not
    /// dispatch or the CPU lacks: on this CPU, every one of its AVX targets
    /// is named, and nothing else (checked with Debian 12's numpy: no
    /// warning, and `__cpu_features__` shows all ten off).
    #[test]
    fn numpy_is_told_exactly_the_avx_targets_the_cpu_has() {
        assert_eq!(
            numpy_entry(&epyc()).unwrap(),
            "AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"
        );
        // The names numpy 1.24 warned about under the old fixed list.
        for unknown in ["AVX512_KNL", "AVX512_KNM", "AVX512_SPR", "X86_V3", "X86_V4"] {
            assert!(!numpy_entry(&epyc()).unwrap().contains(unknown));
        }
    }

    /// Without the OS's AVX-512 state numpy sees no AVX-512 target, so none
    /// is named; without AVX state, only F16C (a CPUID bit numpy takes as
    /// it is).
    #[test]
    fn numpy_is_not_told_of_targets_the_os_state_hides() {
        let avx_only = CpuFeatures {
            xcr0: 0x7,
            ..epyc()
        };
        assert_eq!(numpy_entry(&avx_only).unwrap(), "AVX F16C FMA3 AVX2");
        let sse_only = CpuFeatures {
            xcr0: 0x3,
            ..epyc()
        };
        assert_eq!(numpy_entry(&sse_only).unwrap(), "F16C");
        let no_f16c = CpuFeatures {
            leaf1_ecx: epyc().leaf1_ecx & !(1 << 29),
            ..sse_only
        };
        assert_eq!(numpy_entry(&no_f16c), None);
    }

    /// A Skylake server: SKX only among the AVX-512 groups.
    #[test]
    fn numpy_is_told_only_the_avx512_groups_the_cpu_completes() {
        let skylake = CpuFeatures {
            leaf7: [0xf1bf_07ab & !(1 << 21), 0x0040_5fc6 & !(1 << 11 | 1 << 1)],
            ..epyc()
        };
        assert_eq!(
            numpy_entry(&skylake).unwrap(),
            "AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_SKX"
        );
    }

    #[test]
    fn switches_are_added_unless_the_user_set_them() {
        let switches = library_switches(&epyc());
        let mut env = vec![b"PATH=/bin".to_vec(), b"GLIBC_TUNABLESX=1".to_vec()];
        add_library_switches(&mut env, &switches);
        assert_eq!(env.len(), 2 + switches.len());
        assert_eq!(env[2], switches[0].as_bytes());

        let mut env = vec![
            b"GLIBC_TUNABLES=glibc.malloc.check=3".to_vec(),
            b"OPENSSL_ia32cap=".to_vec(),
        ];
        add_library_switches(&mut env, &switches);
        assert_eq!(env.len(), switches.len());
        assert_eq!(env[0], b"GLIBC_TUNABLES=glibc.malloc.check=3");
        assert_eq!(env[1], b"OPENSSL_ia32cap=");
        assert!(env.contains(&b"OPENBLAS_CORETYPE=Nehalem".to_vec()));
    }
}
