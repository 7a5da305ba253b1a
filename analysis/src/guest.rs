//! Guest introspection at a stop: which process runs, what it is, and what
//! its memory, file descriptors and working directory hold, read from the
//! kernel's own structures through the guest's page tables.

use provm_guest_agent::paths::normalize;
use provm_vmm::paging::Unmapped;
use provm_vmm::vm::GuestView;

use crate::profile::KernelInfo;

/// The longest path or string read from the guest.
const MAX_STRING: usize = 4096;
/// The deepest directory nesting a path walk follows.
const MAX_DEPTH: usize = 256;
/// The file type bits of an inode's mode, and three of the types.
const S_IFMT: u16 = 0o170000;
const S_IFREG: u16 = 0o100000;
const S_IFIFO: u16 = 0o010000;
const S_IFSOCK: u16 = 0o140000;
/// The directory file descriptor that means the working directory.
pub const AT_FDCWD: i64 = -100;

/// A guest task (thread) as the process tables name it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Task {
    /// The process (thread group) id, what user space calls the pid.
    pub pid: i32,
    /// The thread id.
    pub tid: i32,
    /// The parent process's pid.
    pub ppid: i32,
    /// The first 15 bytes of the program's name.
    pub comm: String,
}

/// `struct pt_regs` of x86-64, in the order the kernel's entry code
/// pushes it (arch/x86/include/asm/ptrace.h).
pub const PT_REGS: [&str; 21] = [
    "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi",
    "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss",
];
/// The index of `cs` in `PT_REGS`.
const PT_REGS_CS: usize = 17;

/// The registers the running task had in user mode, as the kernel saved
/// them when it entered (system call, interrupt, fault).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedRegs {
    /// The values, in `PT_REGS` order.
    pub values: [u64; 21],
}

impl SavedRegs {
    /// Whether they are user mode's (a kernel thread has no user frame).
    pub fn from_user_mode(&self) -> bool {
        self.values[PT_REGS_CS] & 3 == 3
    }
}

/// A file a descriptor refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenFile {
    /// Its path; for a pipe or socket, `pipe:[inode]` or `socket:[inode]`
    /// as /proc/PID/fd shows them.
    pub path: String,
    /// A regular file (not a pipe, socket, terminal or directory).
    pub regular: bool,
}

/// The guest at a stop, with the kernel knowledge to read it.
pub struct Guest<'a> {
    pub view: &'a GuestView<'a>,
    kernel: &'a KernelInfo,
}

impl<'a> Guest<'a> {
    pub fn new(view: &'a GuestView<'a>, kernel: &'a KernelInfo) -> Self {
        Guest { view, kernel }
    }

    pub fn read_u64(&self, address: u64) -> Result<u64, Unmapped> {
        let mut bytes = [0u8; 8];
        self.view.read(address, &mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn read_i32(&self, address: u64) -> Result<i32, Unmapped> {
        let mut bytes = [0u8; 4];
        self.view.read(address, &mut bytes)?;
        Ok(i32::from_le_bytes(bytes))
    }

    /// `len` bytes at `address` in the current address space.
    pub fn read_bytes(&self, address: u64, len: usize) -> Result<Vec<u8>, Unmapped> {
        let mut bytes = vec![0u8; len];
        self.view.read(address, &mut bytes)?;
        Ok(bytes)
    }

    /// The NUL-terminated string at `address`, read a page at a time (the
    /// page after it may be unmapped), at most `MAX_STRING` bytes.
    pub fn read_c_string(&self, address: u64) -> Result<String, Unmapped> {
        let mut bytes = Vec::new();
        let mut at = address;
        while bytes.len() < MAX_STRING {
            let in_page = (4096 - at % 4096) as usize;
            let chunk = self.read_bytes(at, in_page.min(MAX_STRING - bytes.len()))?;
            if let Some(end) = chunk.iter().position(|&b| b == 0) {
                bytes.extend_from_slice(&chunk[..end]);
                break;
            }
            bytes.extend_from_slice(&chunk);
            at += chunk.len() as u64;
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The NULL-terminated array of string pointers at `address` (argv).
    pub fn read_string_array(&self, address: u64, limit: usize) -> Result<Vec<String>, Unmapped> {
        let mut strings = Vec::new();
        for index in 0..limit as u64 {
            let pointer = self.read_u64(address + 8 * index)?;
            if pointer == 0 {
                break;
            }
            strings.push(self.read_c_string(pointer)?);
        }
        Ok(strings)
    }

    /// The running task's `task_struct` (the view's vCPU's).
    pub fn current_task(&self) -> Result<u64, Unmapped> {
        self.read_u64(self.this_cpu(self.kernel.symbols.current_task)?)
    }

    /// The view's vCPU's copy of a per-CPU variable.
    fn this_cpu(&self, variable: u64) -> Result<u64, Unmapped> {
        self.kernel
            .symbols
            .per_cpu(variable, self.view.vcpu, |at| self.read_u64(at))
    }

    /// The running task's saved user registers: the `pt_regs` at the top
    /// of its kernel stack.
    pub fn saved_user_regs(&self) -> Result<SavedRegs, Unmapped> {
        let top = self.read_u64(self.this_cpu(self.kernel.symbols.cpu_current_top_of_stack)?)?;
        let frame = top - 8 * PT_REGS.len() as u64;
        let mut values = [0; 21];
        for (index, value) in values.iter_mut().enumerate() {
            *value = self.read_u64(frame + 8 * index as u64)?;
        }
        Ok(SavedRegs { values })
    }

    /// The task at `task` (a `task_struct` address).
    pub fn task(&self, task: u64) -> Result<Task, Unmapped> {
        let o = &self.kernel.offsets;
        let parent = self.parent(task)?;
        let comm = self.read_bytes(task + o.task_struct_comm, o.task_struct_comm_len as usize)?;
        let comm = comm.split(|&b| b == 0).next().unwrap_or_default();
        Ok(Task {
            pid: self.read_i32(task + o.task_struct_tgid)?,
            tid: self.read_i32(task + o.task_struct_pid)?,
            ppid: self.read_i32(parent + o.task_struct_tgid)?,
            comm: String::from_utf8_lossy(comm).into_owned(),
        })
    }

    /// The `task_struct` address of the parent of `task` (its
    /// `real_parent`: the process that forked it, or that process's parent
    /// under CLONE_PARENT).
    pub fn parent(&self, task: u64) -> Result<u64, Unmapped> {
        self.read_u64(task + self.kernel.offsets.task_struct_real_parent)
    }

    /// The file behind descriptor `fd` of `task`, if it has one open.
    pub fn open_file(&self, task: u64, fd: i64) -> Result<Option<OpenFile>, Unmapped> {
        let o = &self.kernel.offsets;
        let files = self.read_u64(task + o.task_struct_files)?;
        if files == 0 || fd < 0 {
            return Ok(None);
        }
        let table = self.read_u64(files + o.files_struct_fdt)?;
        let max = self.read_i32(table + o.fdtable_max_fds)?;
        if fd >= i64::from(max) {
            return Ok(None);
        }
        let array = self.read_u64(table + o.fdtable_fd)?;
        let file = self.read_u64(array + 8 * fd as u64)?;
        if file == 0 {
            return Ok(None);
        }
        let inode = self.read_u64(file + o.file_f_inode)?;
        let mut mode = [0u8; 2];
        self.view.read(inode + o.inode_i_mode, &mut mode)?;
        let kind = u16::from_le_bytes(mode) & S_IFMT;
        let anonymous = match kind {
            S_IFIFO => Some("pipe"),
            S_IFSOCK => Some("socket"),
            _ => None,
        };
        let path = match anonymous {
            Some(what) => format!("{what}:[{}]", self.read_u64(inode + o.inode_i_ino)?),
            None => self.file_path(task, file)?,
        };
        Ok(Some(OpenFile {
            path,
            regular: kind == S_IFREG,
        }))
    }

    /// The path of the program `task` runs, if it has an address space.
    pub fn exe_path(&self, task: u64) -> Result<Option<String>, Unmapped> {
        let o = &self.kernel.offsets;
        let mm = self.read_u64(task + o.task_struct_mm)?;
        if mm == 0 {
            return Ok(None);
        }
        let file = self.read_u64(mm + o.mm_struct_exe_file)?;
        if file == 0 {
            return Ok(None);
        }
        self.file_path(task, file).map(Some)
    }

    /// The path of the open file at `file` (a `struct file`) as `task`
    /// sees it.
    pub fn file_path(&self, task: u64, file: u64) -> Result<String, Unmapped> {
        self.path(task, file + self.kernel.offsets.file_f_path)
    }

    /// The kernel's structure offsets.
    pub fn offsets(&self) -> &crate::profile::Offsets {
        &self.kernel.offsets
    }

    /// The working directory of `task`.
    pub fn cwd(&self, task: u64) -> Result<String, Unmapped> {
        let fs = self.read_u64(task + self.kernel.offsets.task_struct_fs)?;
        self.path(task, fs + self.kernel.offsets.fs_struct_pwd)
    }

    /// The absolute path `name` names for `task`, relative to directory
    /// descriptor `dirfd` (or the working directory, `AT_FDCWD`) as the
    /// `*at` system calls resolve it. Not canonical: `..` stays.
    pub fn resolve(&self, task: u64, dirfd: i64, name: &str) -> Result<String, Unmapped> {
        if name.starts_with('/') {
            return Ok(join("/", name));
        }
        let base = if dirfd == AT_FDCWD {
            self.cwd(task)?
        } else {
            match self.open_file(task, dirfd)? {
                Some(file) => file.path,
                None => return Ok(name.to_owned()),
            }
        };
        Ok(join(&base, name))
    }

    /// The path of the `struct path` at `path` as `task` sees it: from its
    /// root (a chroot's too), across mount points, as the kernel's d_path
    /// builds it.
    fn path(&self, task: u64, path: u64) -> Result<String, Unmapped> {
        let o = &self.kernel.offsets;
        let fs = self.read_u64(task + o.task_struct_fs)?;
        let root = (
            self.read_u64(fs + o.fs_struct_root + o.path_mnt)?,
            self.read_u64(fs + o.fs_struct_root + o.path_dentry)?,
        );
        let mut mnt = self.read_u64(path + o.path_mnt)?;
        let mut dentry = self.read_u64(path + o.path_dentry)?;
        let mut names = Vec::new();
        for _ in 0..MAX_DEPTH {
            if (mnt, dentry) == root {
                break;
            }
            let mount = mnt - o.mount_mnt;
            if dentry == self.read_u64(mnt + o.vfsmount_mnt_root)? {
                let parent = self.read_u64(mount + o.mount_mnt_parent)?;
                if parent == mount {
                    break;
                }
                dentry = self.read_u64(mount + o.mount_mnt_mountpoint)?;
                mnt = parent + o.mount_mnt;
                continue;
            }
            let parent = self.read_u64(dentry + o.dentry_d_parent)?;
            if parent == dentry {
                break;
            }
            names.push(self.read_c_string(self.read_u64(dentry + o.dentry_d_name + o.qstr_name)?)?);
            dentry = parent;
        }
        names.reverse();
        Ok(format!("/{}", names.join("/")))
    }
}

/// `name` relative to directory `base`, lexically normal (as the agent's
/// tracer names paths, so that both sides key files alike).
fn join(base: &str, name: &str) -> String {
    String::from_utf8_lossy(&normalize(base.as_bytes(), name.as_bytes())).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_names_join_their_directory() {
        assert_eq!(join("/", "data/in.txt"), "/data/in.txt");
        assert_eq!(join("/work", "out"), "/work/out");
        assert_eq!(join("/work", "../tmp/./x"), "/tmp/x");
    }
}
