#!/usr/bin/env python3
"""The VMX test bed's boot disk (scripts/vmx-testbed): a Linux kernel's
vmlinux and an initramfs laid out for scripts/vmx-testbed-boot.asm, which
copies them to their physical addresses and enters the kernel's PVH entry.

    vmx-testbed-disk.py vmlinux VMLINUX OUT    unpacks a bzImage's vmlinux
    vmx-testbed-disk.py disk VMLINUX INITRD MEMORY_MIB CMDLINE OUT
        writes OUT with sector 0 left empty and prints the boot sector's
        nasm defines (-DHEADER=... -DENTRY=...)

Only the kernel's non-zero pages go on the disk (the machine's memory
starts zeroed). The hvm_start_info layout is Xen's
(xen/include/public/arch-x86/hvm/start_info.h, version 1).
"""
import lzma
import struct
import sys

PAGE = 4096
SECTOR = 512
START_INFO = 0x8000  # the boot sector's START_INFO
TABLE = 0x9000  # the boot sector's TABLE
XEN_ELFNOTE_PHYS32_ENTRY = 18
HVM_START_MAGIC = 0x336EC578
# Where the initramfs goes: above the kernel (which ends below 128 MiB).
INITRD_ADDRESS = 0x10000000
# Bochs's BIOS keeps its ACPI tables in the last 64 KiB of memory: the last
# MiB is left out of the RAM the kernel is given.
TOP_RESERVED = 1 << 20


def vmlinux(bzimage_path, out_path):
    """The vmlinux inside a bzImage: the payload the setup header points at
    (payload_offset, payload_length at 0x248), XZ-compressed."""
    data = open(bzimage_path, "rb").read()
    setup_sects = data[0x1F1] or 4
    offset, length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * SECTOR + offset
    payload = data[start : start + length]
    if payload[:6] != b"\xfd7zXZ\x00":
        sys.exit(f"{bzimage_path}: its payload is not XZ ({payload[:6].hex()})")
    # The stream is followed by the decompressor's size field: decompress
    # the one stream, ignore what follows.
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    out = decompressor.decompress(payload)
    if not decompressor.eof:
        sys.exit(f"{bzimage_path}: its XZ payload is cut short")
    open(out_path, "wb").write(out)


def elf_segments_and_entry(data):
    """PT_LOAD segments as (physical address, bytes) and the PVH entry."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit("vmlinux is not a 64-bit ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    segments, entry = [], None
    for i in range(phnum):
        p_type, _flags, offset, _vaddr, paddr, filesz, _memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            segments.append((paddr, data[offset : offset + filesz]))
        elif p_type == 4:  # PT_NOTE
            at, end = offset, offset + filesz
            while at + 12 <= end:
                namesz, descsz, kind = struct.unpack_from("<III", data, at)
                name = data[at + 12 : at + 12 + namesz]
                desc_at = at + 12 + ((namesz + 3) & ~3)
                if name == b"Xen\x00" and kind == XEN_ELFNOTE_PHYS32_ENTRY:
                    entry = struct.unpack_from("<I", data, desc_at)[0]
                at = desc_at + ((descsz + 3) & ~3)
    if entry is None:
        sys.exit("vmlinux has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): a kernel built without CONFIG_PVH")
    return segments, entry


def extents(address, data):
    """Runs of non-zero pages of data loaded at address: (address, bytes)."""
    runs, start = [], None
    for at in range(0, len(data), PAGE):
        zero = not any(data[at : at + PAGE])
        if not zero and start is None:
            start = at
        elif zero and start is not None:
            runs.append((address + start, data[start:at]))
            start = None
    if start is not None:
        runs.append((address + start, data[start:]))
    return runs


def disk(vmlinux_path, initrd_path, memory_mib, cmdline, out_path):
    segments, entry = elf_segments_and_entry(open(vmlinux_path, "rb").read())
    initrd = open(initrd_path, "rb").read()
    memory = memory_mib << 20
    if INITRD_ADDRESS + len(initrd) > memory - TOP_RESERVED:
        sys.exit(f"the initramfs ({len(initrd) >> 20} MiB) does not fit in {memory_mib} MiB")
    pieces = []
    for address, data in segments:
        if address + len(data) > INITRD_ADDRESS:
            sys.exit("the kernel reaches the initramfs's address")
        pieces += extents(address, data)
    pieces.append((INITRD_ADDRESS, initrd))

    # The start-info page: hvm_start_info, one module (the initramfs), the
    # memory map, the command line.
    modlist, memmap, cmdline_at = START_INFO + 0x40, START_INFO + 0x80, START_INFO + 0x100
    ram, reserved = 1, 2
    memory_map = [
        (0, 0x9FC00, ram),
        (0x9FC00, 0x400, reserved),  # the BIOS's data (EBDA)
        (0xE0000, 0x20000, reserved),  # the BIOS
        (0x100000, memory - TOP_RESERVED - 0x100000, ram),
        (memory - TOP_RESERVED, TOP_RESERVED, reserved),
    ]
    command_line = cmdline.encode() + b"\0"
    if len(command_line) > PAGE - 0x100:
        sys.exit("the command line is too long")
    page = bytearray(PAGE)
    struct.pack_into(
        "<IIIIQQQQII", page, 0, HVM_START_MAGIC, 1, 0, 1, modlist, cmdline_at, 0, memmap, len(memory_map), 0
    )
    struct.pack_into("<QQQQ", page, modlist - START_INFO, INITRD_ADDRESS, len(initrd), 0, 0)
    for i, (address, size, kind) in enumerate(memory_map):
        struct.pack_into("<QQII", page, memmap - START_INFO + 24 * i, address, size, kind, 0)
    page[cmdline_at - START_INFO : cmdline_at - START_INFO + len(command_line)] = command_line

    # The header (start-info page, extent table), then the data, each
    # piece starting on a sector.
    table_bytes = 12 * (len(pieces) + 1)
    header_sectors = (TABLE - START_INFO + table_bytes + SECTOR - 1) // SECTOR
    if START_INFO + header_sectors * SECTOR > 0x7C000:
        sys.exit("too many extents for the boot sector's table")
    lba = 1 + header_sectors
    table = bytearray()
    with open(out_path, "wb") as out:
        out.seek(lba * SECTOR)
        for address, data in pieces:
            sectors = (len(data) + SECTOR - 1) // SECTOR
            table += struct.pack("<III", lba, address, sectors)
            out.seek(lba * SECTOR)
            out.write(data)
            lba += sectors
        table += struct.pack("<III", 0, 0, 0)
        header = bytes(page) + bytes(table)
        out.seek(SECTOR)
        out.write(header)
        # Bochs wants a flat disk a whole number of 16-head, 63-sector
        # cylinders long.
        cylinder = 16 * 63 * SECTOR
        size = (lba * SECTOR + cylinder - 1) // cylinder * cylinder
        out.truncate(size)
    print(f"-DHEADER={header_sectors} -DENTRY={entry:#x}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "vmlinux":
        vmlinux(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 7 and sys.argv[1] == "disk":
        disk(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        sys.exit(__doc__)
