//! A program's argv and environment, read from its new stack while it is
//! stopped right after its exec: the stack pointer addresses argc, then the
//! argv and envp pointer arrays, and the strings lie above them. One
//! process_vm_readv usually covers it all, where reading
//! /proc/PID/{cmdline,environ} costs ten system calls, each expensive where
//! guest ring 0 is emulated.

use std::io;

use super::ptrace::{self, Pid};

/// The first read: enough for the pointers and strings of a usual command.
const FIRST_WINDOW: usize = 16 * 1024;
/// The kernel's own bound for argv and environment together (a quarter of
/// an 8 MiB stack limit, which is what the guest runs with).
const LARGEST_WINDOW: usize = 2 * 1024 * 1024;

/// argv and the environment, each item without its NUL.
type Lists = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// argv and the environment of `pid`, stopped at its exec event with its
/// stack pointer at `rsp`.
pub fn exec_lists(pid: Pid, rsp: u64) -> io::Result<Lists> {
    let mut window = FIRST_WINDOW;
    loop {
        let mut stack = vec![0; window];
        let len = ptrace::read_memory(pid, rsp, &mut stack)?;
        stack.truncate(len);
        match parse(&stack, rsp) {
            Some(lists) => return Ok(lists),
            // Everything there was to read was read: not an exec's stack.
            None if len < window || window >= LARGEST_WINDOW => {
                return Err(io::Error::from_raw_os_error(libc::EFAULT))
            }
            None => window *= 4,
        }
    }
}

/// The two lists in `stack`, the memory at `base` onwards; `None` when
/// part of them lies beyond it.
fn parse(stack: &[u8], base: u64) -> Option<Lists> {
    let word = |index: usize| -> Option<u64> {
        let bytes = stack.get(index * 8..index * 8 + 8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    };
    let string = |address: u64| -> Option<Vec<u8>> {
        let start = usize::try_from(address.checked_sub(base)?).ok()?;
        let rest = stack.get(start..)?;
        let len = rest.iter().position(|&byte| byte == 0)?;
        Some(rest[..len].to_vec())
    };
    let argc = usize::try_from(word(0)?).ok()?;
    let argv = (1..=argc)
        .map(|index| string(word(index)?))
        .collect::<Option<Vec<_>>>()?;
    let mut env = Vec::new();
    // argv's NULL, then envp up to its NULL.
    for index in argc + 2.. {
        match word(index)? {
            0 => return Some((argv, env)),
            address => env.push(string(address)?),
        }
    }
    unreachable!("the loop ends at envp's NULL or the end of the stack")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack as exec lays it out, at `base`: argc, argv, NULL, envp,
    /// NULL, then the strings.
    fn exec_stack(base: u64, argv: &[&[u8]], env: &[&[u8]]) -> Vec<u8> {
        let words = 1 + argv.len() + 1 + env.len() + 1;
        let mut strings = Vec::new();
        let mut pointers = vec![argv.len() as u64];
        for (index, item) in argv.iter().chain(env).enumerate() {
            if index == argv.len() {
                pointers.push(0);
            }
            pointers.push(base + (words * 8 + strings.len()) as u64);
            strings.extend_from_slice(item);
            strings.push(0);
        }
        pointers.push(0);
        let mut stack: Vec<u8> = pointers
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect();
        stack.extend(strings);
        stack
    }

    #[test]
    fn lists_are_read_from_an_exec_stack() {
        let base = 0x7fff_0000;
        let stack = exec_stack(base, &[b"sed", b"", b"s/a/b/"], &[b"PATH=/bin", b"HOME=/"]);
        let (argv, env) = parse(&stack, base).unwrap();
        assert_eq!(argv, [&b"sed"[..], b"", b"s/a/b/"]);
        assert_eq!(env, [&b"PATH=/bin"[..], b"HOME=/"]);
        // Cut short: the last string's end is not there.
        assert_eq!(parse(&stack[..stack.len() - 2], base), None);
    }

    #[test]
    fn lists_are_read_from_a_process() {
        let mut memory = vec![0u8; 512];
        let base = memory.as_ptr() as u64;
        let stack = exec_stack(base, &[b"sh", b"-c"], &[b"LANG=C"]);
        memory[..stack.len()].copy_from_slice(&stack);
        let (argv, env) = exec_lists(std::process::id() as Pid, base).unwrap();
        assert_eq!(argv, [&b"sh"[..], b"-c"]);
        assert_eq!(env, [b"LANG=C"]);
    }
}
