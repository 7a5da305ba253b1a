//! What provm knows of its guest kernel's insides: the addresses of a few
//! symbols (from the vmlinux a trace embeds) and the offsets of the
//! structure fields it reads (the kernel profile, computed at kernel build
//! time by kernels/profile/provm_profile.c and embedded beside it).

use std::collections::HashMap;

use object::{Object, ObjectSymbol};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("the embedded kernel is not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    #[error("the kernel has no symbol {0}: it is not a provm kernel")]
    MissingSymbol(&'static str),
    #[error("the kernel profile does not fit this provm ({0}): the trace was recorded by another version")]
    Json(#[from] serde_json::Error),
}

/// The kernel functions and variables an observer uses.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Symbols {
    /// `do_syscall_64(regs, nr)`: every system call enters here.
    pub do_syscall_64: u64,
    /// `syscall_exit_to_user_mode(regs)`: every system call returns here,
    /// and a new task's first return to user mode (from `ret_from_fork`).
    pub syscall_exit_to_user_mode: u64,
    /// `do_exit(code)`: every task ends here.
    pub do_exit: u64,
    /// The running task: a per-CPU variable (see `per_cpu`).
    pub current_task: u64,
    /// The top of the running task's kernel stack, where entry code saved
    /// its user registers: per-CPU too.
    pub cpu_current_top_of_stack: u64,
    /// `__per_cpu_offset[]`, each CPU's per-CPU area, in an SMP kernel
    /// only: a uniprocessor kernel's per-CPU variables are plain globals.
    pub per_cpu_offset: Option<u64>,
    /// The kernel's own page tables (`swapper_pg_dir`), which map the
    /// kernel's half of every address space and are never freed.
    pub init_top_pgt: u64,
}

impl Symbols {
    /// Reads the symbols from a vmlinux's symbol table.
    pub fn from_vmlinux(vmlinux: &[u8]) -> Result<Symbols, ProfileError> {
        let elf = object::File::parse(vmlinux)?;
        let wanted = [
            "do_syscall_64",
            "syscall_exit_to_user_mode",
            "do_exit",
            "current_task",
            "cpu_current_top_of_stack",
            "init_top_pgt",
            "__per_cpu_offset",
        ];
        let found: HashMap<&str, u64> = elf
            .symbols()
            .filter_map(|symbol| {
                let name = symbol.name().ok()?;
                wanted.contains(&name).then(|| (name, symbol.address()))
            })
            .collect();
        let address = |name: &'static str| {
            found
                .get(name)
                .copied()
                .ok_or(ProfileError::MissingSymbol(name))
        };
        Ok(Symbols {
            do_syscall_64: address("do_syscall_64")?,
            syscall_exit_to_user_mode: address("syscall_exit_to_user_mode")?,
            do_exit: address("do_exit")?,
            current_task: address("current_task")?,
            cpu_current_top_of_stack: address("cpu_current_top_of_stack")?,
            init_top_pgt: address("init_top_pgt")?,
            per_cpu_offset: found.get("__per_cpu_offset").copied(),
        })
    }
}

/// Where x86-64 Linux maps its image (`__START_KERNEL_map`): an address
/// of the kernel's image less this is its physical address, for a kernel
/// loaded where it was linked to be (provm loads it so: no relocation).
pub const START_KERNEL_MAP: u64 = 0xffff_ffff_8000_0000;

impl Symbols {
    /// The CR3 that reads kernel memory whatever process runs: the
    /// physical address of `init_top_pgt`.
    pub fn kernel_cr3(&self) -> u64 {
        self.init_top_pgt - START_KERNEL_MAP
    }

    /// Where CPU `cpu`'s copy of the per-CPU variable `variable` is, with
    /// `read_u64` reading kernel memory. An SMP kernel links per-CPU
    /// variables as offsets into a CPU's area; Linux numbers the CPUs as
    /// the MP table lists them, so CPU n is vCPU n.
    pub fn per_cpu<E>(
        &self,
        variable: u64,
        cpu: usize,
        read_u64: impl FnOnce(u64) -> Result<u64, E>,
    ) -> Result<u64, E> {
        match self.per_cpu_offset {
            Some(offsets) => Ok(read_u64(offsets + 8 * cpu as u64)? + variable),
            None => Ok(variable),
        }
    }
}

/// Field offsets, named `<struct>_<field>` as the profile names them (it
/// has more; only these are read).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Offsets {
    pub task_struct_pid: u64,
    pub task_struct_tgid: u64,
    pub task_struct_comm: u64,
    pub task_struct_comm_len: u64,
    pub task_struct_real_parent: u64,
    pub task_struct_mm: u64,
    pub task_struct_fs: u64,
    pub task_struct_files: u64,
    pub mm_struct_exe_file: u64,
    pub fs_struct_root: u64,
    pub fs_struct_pwd: u64,
    pub files_struct_fdt: u64,
    pub fdtable_max_fds: u64,
    pub fdtable_fd: u64,
    pub file_f_path: u64,
    pub file_f_inode: u64,
    pub path_mnt: u64,
    pub path_dentry: u64,
    pub dentry_d_parent: u64,
    pub dentry_d_name: u64,
    pub qstr_name: u64,
    pub inode_i_mode: u64,
    pub inode_i_ino: u64,
    pub vfsmount_mnt_root: u64,
    pub mount_mnt: u64,
    pub mount_mnt_parent: u64,
    pub mount_mnt_mountpoint: u64,
    pub pt_regs_di: u64,
    pub pt_regs_si: u64,
    pub pt_regs_dx: u64,
    pub pt_regs_r10: u64,
    pub pt_regs_r8: u64,
    pub pt_regs_r9: u64,
    pub pt_regs_ax: u64,
    pub pt_regs_orig_ax: u64,
}

impl Offsets {
    /// Reads the profile's JSON object of names to values.
    pub fn from_json(json: &[u8]) -> Result<Offsets, ProfileError> {
        Ok(serde_json::from_slice(json)?)
    }
}

/// Everything an observer needs to know of the guest kernel.
#[derive(Clone, Debug)]
pub struct KernelInfo {
    pub symbols: Symbols,
    pub offsets: Offsets,
}

impl KernelInfo {
    pub fn load(vmlinux: &[u8], profile_json: &[u8]) -> Result<KernelInfo, ProfileError> {
        Ok(KernelInfo {
            symbols: Symbols::from_vmlinux(vmlinux)?,
            offsets: Offsets::from_json(profile_json)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_missing_an_offset_names_it() {
        let error = Offsets::from_json(br#"{"task_struct_pid": 696}"#).unwrap_err();
        assert!(error.to_string().contains("task_struct_tgid"), "{error}");
    }

    #[test]
    fn a_per_cpu_variable_is_in_that_cpus_area_only_in_an_smp_kernel() {
        let mut symbols = Symbols {
            do_syscall_64: 0,
            syscall_exit_to_user_mode: 0,
            do_exit: 0,
            current_task: 0x1ac00,
            cpu_current_top_of_stack: 0x1abd0,
            per_cpu_offset: None,
            init_top_pgt: 0,
        };
        let areas = [0xffff_8880_0400_0000u64, 0xffff_8880_0440_0000];
        let read = |at: u64| -> Result<u64, ()> {
            let index = (at - 0xffff_ffff_818c_e6a0) / 8;
            areas.get(index as usize).copied().ok_or(())
        };
        assert_eq!(symbols.per_cpu(symbols.current_task, 1, read), Ok(0x1ac00));
        symbols.per_cpu_offset = Some(0xffff_ffff_818c_e6a0);
        assert_eq!(
            symbols.per_cpu(symbols.current_task, 1, read),
            Ok(0xffff_8880_0441_ac00)
        );
        assert_eq!(
            symbols.per_cpu(symbols.current_task, 0, read),
            Ok(0xffff_8880_0401_ac00)
        );
        assert_eq!(symbols.per_cpu(symbols.current_task, 2, read), Err(()));
    }
}
