//! Detects vector register state that user space may use but the guest
//! kernel does not save, and keeps glibc out of it.
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

/// The environment entry given to commands when the vector state is not
/// managed: glibc 2.36 then selects its SSE2 string functions, whose XMM
/// registers the kernel's FXSAVE does save. Each name is one that glibc's
/// `glibc.cpu.hwcaps` parser knows (sysdeps/x86/cpu-tunables.c); checked with
/// `ld.so --list-diagnostics`, whose active CPU feature bits change for each.
/// ERMS and FSRM (`rep movsb`) are left enabled: they use no vector state.
pub const GLIBC_TUNABLES: &str =
    "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD";

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

/// Adds [`GLIBC_TUNABLES`] to a command's environment `env` (`KEY=VALUE`
/// entries), unless it has a GLIBC_TUNABLES of its own: the user's choice.
pub fn add_glibc_tunables(env: &mut Vec<Vec<u8>>) {
    let ours = |entry: &Vec<u8>| entry.starts_with(b"GLIBC_TUNABLES=");
    if !env.iter().any(ours) {
        env.push(GLIBC_TUNABLES.as_bytes().to_vec());
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
    fn tunables_are_added_unless_the_user_set_them() {
        let mut env = vec![b"PATH=/bin".to_vec(), b"GLIBC_TUNABLESX=1".to_vec()];
        add_glibc_tunables(&mut env);
        assert_eq!(env.len(), 3);
        assert_eq!(env[2], GLIBC_TUNABLES.as_bytes());

        let mut env = vec![b"GLIBC_TUNABLES=glibc.malloc.check=3".to_vec()];
        add_glibc_tunables(&mut env);
        assert_eq!(env, [b"GLIBC_TUNABLES=glibc.malloc.check=3".to_vec()]);

        let mut env = vec![b"GLIBC_TUNABLES=".to_vec()];
        add_glibc_tunables(&mut env);
        assert_eq!(env.len(), 1);
    }
}
