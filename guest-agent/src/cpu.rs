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
use std::arch::x86_64::__cpuid;

/// CPUID.1:ECX.OSXSAVE: the kernel set CR4.OSXSAVE, so `xgetbv` works.
const OSXSAVE: u32 = 1 << 27;

/// XCR0's x87 and SSE bits: the state FXSAVE saves.
const X87_SSE: u64 = 0b11;

/// The environment entries given to commands when the vector state is not
/// managed: each keeps one library that chooses its code by CPUID on x87
/// and SSE registers, which the kernel's FXSAVE does save. A variable the
/// user set is left alone.
pub const LIBRARY_SWITCHES: &[&str] = &[
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
    // numpy's runtime dispatch, by the names of numpy 1.x and of 2.x
    // (X86_V3, X86_V4, ...). A name a build does not dispatch raises only an
    // ImportWarning, which Python hides by default.
    "NPY_DISABLE_CPU_FEATURES=AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR X86_V3 X86_V4",
];

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

/// Adds [`LIBRARY_SWITCHES`] to a command's environment `env` (`KEY=VALUE`
/// entries), each unless `env` sets its variable already: the user's choice.
pub fn add_library_switches(env: &mut Vec<Vec<u8>>) {
    for switch in LIBRARY_SWITCHES {
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

    #[test]
    fn switches_are_added_unless_the_user_set_them() {
        let mut env = vec![b"PATH=/bin".to_vec(), b"GLIBC_TUNABLESX=1".to_vec()];
        add_library_switches(&mut env);
        assert_eq!(env.len(), 2 + LIBRARY_SWITCHES.len());
        assert_eq!(env[2], LIBRARY_SWITCHES[0].as_bytes());

        let mut env = vec![
            b"GLIBC_TUNABLES=glibc.malloc.check=3".to_vec(),
            b"OPENSSL_ia32cap=".to_vec(),
        ];
        add_library_switches(&mut env);
        assert_eq!(env.len(), LIBRARY_SWITCHES.len());
        assert_eq!(env[0], b"GLIBC_TUNABLES=glibc.malloc.check=3");
        assert_eq!(env[1], b"OPENSSL_ia32cap=");
        assert!(env.contains(&b"OPENBLAS_CORETYPE=Nehalem".to_vec()));
    }
}
