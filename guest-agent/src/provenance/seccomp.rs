//! The seccomp filter that makes a traced process stop only at the system
//! calls provenance needs: each stop costs two context switches and the
//! tracer's own system calls, all in the guest kernel, whose ring 0 may be
//! emulated. Every other system call runs untouched.
//!
//! Processes, not calls, are followed through ptrace options (fork, vfork,
//! clone, exec); `close` is not stopped at (it is the most frequent call of
//! all, on pipes as much as files): what a process wrote is read when it
//! exits, or when another process touches the file first.
//!
//! Hand-written rather than built by rust-vmm's `seccompiler`: its filters
//! start with an architecture check that returns SECCOMP_RET_KILL_PROCESS
//! for any other architecture (`build_arch_validation_sequence`, 0.5.0),
//! where this one lets i386 calls through untraced, so a 32-bit program in
//! the image would be killed under `--prov`. Size was no obstacle: with
//! seccompiler and nix (see ptrace.rs) the stripped static agent grew from
//! 1,256,640 to 1,271,680 bytes (+15 KB).

use std::io;

/// The system calls the tracer stops at: the ones that name a file.
pub const TRACED: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_creat,
    libc::SYS_truncate,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_chdir,
    libc::SYS_fchdir,
];

/// linux/audit.h: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

/// The filter program: 32-bit (i386) and x32 calls pass untraced, a hole
/// the README names; so do all calls not in [`TRACED`].
pub fn filter() -> Vec<libc::sock_filter> {
    let load = |offset| statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset);
    let count = TRACED.len() as u8;
    let mut program = vec![
        load(ARCH_OFFSET),
        // Not x86-64: jump past the number checks to ALLOW.
        jump_if_equal(AUDIT_ARCH_X86_64, 0, count + 1),
        load(NR_OFFSET),
    ];
    for (index, &nr) in TRACED.iter().enumerate() {
        // Equal: jump over the remaining checks and ALLOW, to TRACE.
        program.push(jump_if_equal(nr as u32, count - index as u8, 0));
    }
    program.push(statement(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_ALLOW,
    ));
    program.push(statement(
        libc::BPF_RET | libc::BPF_K,
        libc::SECCOMP_RET_TRACE,
    ));
    program
}

/// Installs `program` on the calling thread; it is inherited by every
/// child and cannot be removed. Called between fork and exec, so it only
/// makes system calls.
pub fn install(program: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut _,
    };
    // The agent runs as root (CAP_SYS_ADMIN), so no_new_privs is not needed
    // and set-user-ID programs in the image keep working. A command run as
    // another user (a container image's User) has dropped root already
    // (std sets the ids before the pre-exec hooks): without CAP_SYS_ADMIN
    // the kernel takes a filter only under no_new_privs.
    // SAFETY: geteuid(2) touches no memory of ours.
    let root = unsafe { libc::geteuid() } == 0;
    // SAFETY: prctl(2) with integer arguments touches no memory of ours.
    if !root && unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `program`, whose `len` instructions
    // it describes; both live past the call, and the kernel copies the filter
    // in. Installing a filter affects only this process (the child about to
    // exec), which is the intent.
    let result = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump_if_equal(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the classic BPF program on one (arch, nr), as the kernel would.
    fn verdict(program: &[libc::sock_filter], arch: u32, nr: u32) -> u32 {
        let (mut pc, mut accumulator) = (0usize, 0u32);
        loop {
            let insn = program[pc];
            let code = u32::from(insn.code);
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                accumulator = if insn.k == ARCH_OFFSET { arch } else { nr };
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                let skip = if accumulator == insn.k {
                    insn.jt
                } else {
                    insn.jf
                };
                pc += usize::from(skip);
            } else {
                assert_eq!(code, libc::BPF_RET | libc::BPF_K);
                return insn.k;
            }
            pc += 1;
        }
    }

    #[test]
    fn only_file_calls_of_x86_64_are_traced() {
        let program = filter();
        for &nr in TRACED {
            assert_eq!(
                verdict(&program, AUDIT_ARCH_X86_64, nr as u32),
                libc::SECCOMP_RET_TRACE,
                "{nr}"
            );
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_close,
            libc::SYS_execve,
        ] {
            assert_eq!(
                verdict(&program, AUDIT_ARCH_X86_64, nr as u32),
                libc::SECCOMP_RET_ALLOW
            );
        }
        // x32 numbers carry bit 30; i386 has its own arch value.
        let x32_open = libc::SYS_openat as u32 | 0x4000_0000;
        assert_eq!(
            verdict(&program, AUDIT_ARCH_X86_64, x32_open),
            libc::SECCOMP_RET_ALLOW
        );
        assert_eq!(verdict(&program, 0x4000_0003, 5), libc::SECCOMP_RET_ALLOW);
    }
}
