// SPDX-License-Identifier: GPL-2.0
/*
 * The layout of the kernel structures provm reads from outside the guest
 * (process, memory map, open files, paths, saved registers), as asm-offsets
 * computes its own: compiled to assembler only, never linked. kernels/build.sh
 * turns the "->name value" lines into the kernel profile (profile.json) that
 * provm keeps with the kernel and embeds in every trace.
 */
#include <linux/kbuild.h>
#include <linux/sched.h>
#include <linux/mm_types.h>
#include <linux/maple_tree.h>
#include <linux/mmzone.h>
#include <linux/page-flags.h>
#include <linux/fs.h>
#include <linux/fs_struct.h>
#include <linux/fdtable.h>
#include <linux/dcache.h>
#include <linux/mount.h>
#include <linux/path.h>
#include <asm/ptrace.h>
#include "mount.h"

void provm_profile(void);

void provm_profile(void)
{
	OFFSET(task_struct_pid, task_struct, pid);
	OFFSET(task_struct_tgid, task_struct, tgid);
	OFFSET(task_struct_comm, task_struct, comm);
	OFFSET(task_struct_real_parent, task_struct, real_parent);
	OFFSET(task_struct_group_leader, task_struct, group_leader);
	OFFSET(task_struct_mm, task_struct, mm);
	OFFSET(task_struct_fs, task_struct, fs);
	OFFSET(task_struct_files, task_struct, files);
	OFFSET(task_struct_tasks, task_struct, tasks);
	DEFINE(task_struct_comm_len, TASK_COMM_LEN);

	OFFSET(mm_struct_pgd, mm_struct, pgd);
	OFFSET(mm_struct_exe_file, mm_struct, exe_file);
	OFFSET(mm_struct_arg_start, mm_struct, arg_start);
	OFFSET(mm_struct_arg_end, mm_struct, arg_end);
	OFFSET(mm_struct_start_brk, mm_struct, start_brk);
	OFFSET(mm_struct_brk, mm_struct, brk);
	OFFSET(mm_struct_start_stack, mm_struct, start_stack);

	/* Who owns a physical page: its struct page, found through the
	 * sparse memory model's sections (no vmemmap in this kernel). */
	DEFINE(section_size_bits, SECTION_SIZE_BITS);
	DEFINE(sections_per_root, SECTIONS_PER_ROOT);
	DEFINE(mem_section_size, sizeof(struct mem_section));
	OFFSET(mem_section_section_mem_map, mem_section, section_mem_map);
	DEFINE(section_map_mask, SECTION_MAP_MASK);
	DEFINE(page_size, sizeof(struct page));
	OFFSET(page_flags, page, flags);
	OFFSET(page_mapping, page, mapping);
	OFFSET(page_index, page, index);
	OFFSET(page_page_type, page, page_type);
	OFFSET(page_refcount, page, _refcount);
	DEFINE(pg_slab, PG_slab);
	DEFINE(page_type_base, PAGE_TYPE_BASE);
	DEFINE(pg_buddy, PG_buddy);
	DEFINE(pg_table, PG_table);
	DEFINE(page_mapping_anon, PAGE_MAPPING_ANON);
	OFFSET(address_space_host, address_space, host);
	OFFSET(inode_i_dentry, inode, i_dentry);
	OFFSET(inode_i_sb, inode, i_sb);
	OFFSET(super_block_s_id, super_block, s_id);
	OFFSET(dentry_d_alias, dentry, d_u.d_alias);

	/* A process's mappings: its VMAs, the entries of a maple tree. */
	OFFSET(mm_struct_mm_mt, mm_struct, mm_mt);
	OFFSET(maple_tree_ma_root, maple_tree, ma_root);
	DEFINE(maple_node_mask, MAPLE_NODE_MASK);
	DEFINE(maple_node_type_shift, MAPLE_NODE_TYPE_SHIFT);
	DEFINE(maple_node_type_mask, MAPLE_NODE_TYPE_MASK);
	DEFINE(maple_leaf_64, maple_leaf_64);
	DEFINE(maple_range_64, maple_range_64);
	DEFINE(maple_arange_64, maple_arange_64);
	DEFINE(maple_range64_slots, MAPLE_RANGE64_SLOTS);
	DEFINE(maple_arange64_slots, MAPLE_ARANGE64_SLOTS);
	OFFSET(maple_range_64_pivot, maple_range_64, pivot);
	OFFSET(maple_range_64_slot, maple_range_64, slot);
	OFFSET(maple_range_64_meta, maple_range_64, meta);
	OFFSET(maple_arange_64_pivot, maple_arange_64, pivot);
	OFFSET(maple_arange_64_slot, maple_arange_64, slot);
	OFFSET(maple_arange_64_meta, maple_arange_64, meta);
	OFFSET(maple_metadata_end, maple_metadata, end);
	OFFSET(vm_area_struct_vm_start, vm_area_struct, vm_start);
	OFFSET(vm_area_struct_vm_end, vm_area_struct, vm_end);
	OFFSET(vm_area_struct_vm_mm, vm_area_struct, vm_mm);
	OFFSET(vm_area_struct_vm_pgoff, vm_area_struct, vm_pgoff);
	OFFSET(vm_area_struct_vm_file, vm_area_struct, vm_file);

	OFFSET(fs_struct_root, fs_struct, root);
	OFFSET(fs_struct_pwd, fs_struct, pwd);
	OFFSET(files_struct_fdt, files_struct, fdt);
	OFFSET(fdtable_max_fds, fdtable, max_fds);
	OFFSET(fdtable_fd, fdtable, fd);

	OFFSET(file_f_path, file, f_path);
	OFFSET(file_f_inode, file, f_inode);
	OFFSET(file_f_pos, file, f_pos);
	OFFSET(path_mnt, path, mnt);
	OFFSET(path_dentry, path, dentry);
	OFFSET(dentry_d_parent, dentry, d_parent);
	OFFSET(dentry_d_name, dentry, d_name);
	OFFSET(qstr_name, qstr, name);
	OFFSET(inode_i_mode, inode, i_mode);
	OFFSET(inode_i_ino, inode, i_ino);
	OFFSET(inode_i_size, inode, i_size);
	OFFSET(vfsmount_mnt_root, vfsmount, mnt_root);
	OFFSET(mount_mnt, mount, mnt);
	OFFSET(mount_mnt_parent, mount, mnt_parent);
	OFFSET(mount_mnt_mountpoint, mount, mnt_mountpoint);

	OFFSET(pt_regs_di, pt_regs, di);
	OFFSET(pt_regs_si, pt_regs, si);
	OFFSET(pt_regs_dx, pt_regs, dx);
	OFFSET(pt_regs_r10, pt_regs, r10);
	OFFSET(pt_regs_r8, pt_regs, r8);
	OFFSET(pt_regs_r9, pt_regs, r9);
	OFFSET(pt_regs_ax, pt_regs, ax);
	OFFSET(pt_regs_orig_ax, pt_regs, orig_ax);
	OFFSET(pt_regs_ip, pt_regs, ip);
	OFFSET(pt_regs_sp, pt_regs, sp);

	DEFINE(page_offset, __PAGE_OFFSET_BASE_L4);
}
