; The VMX test bed's boot sector (scripts/vmx-testbed): loads an
; uncompressed Linux (vmlinux) and its initramfs from the disk straight to
; their physical addresses and enters the kernel at its PVH entry point.
;
; Why: Bochs boots a bzImage through its XZ decompressor in 93-110 s of the
; ~160 s to /init, and Debian's Bochs 2.7 loads `optramimage` files above
; 1 MiB as zeros. The vmlinux, unpacked on the host, needs neither.
;
; Disk layout, written by scripts/vmx-testbed-disk.py:
;   sector 0           this sector
;   sectors 1..HEADER  loaded to 0x8000: the hvm_start_info (at 0x8000,
;                      with its module list, memory map and command line
;                      in the same page), then at 0x9000 the extent table
;   the rest           the data the table points at
; An extent is three dwords: first sector (LBA), physical destination,
; sector count; a zero count ends the table. Bochs's memory starts zeroed,
; so the kernel's zero pages (its .bss, its zero-filled tables) are not on
; the disk at all.
;
; It runs in 32-bit flat protected mode from the start (as the PVH entry
; wants) and reads the disk with ATA PIO (READ SECTORS, `rep insd`) at the
; primary channel's ports, interrupts off: no BIOS call and no copy through
; a low buffer. Assemble: nasm -f bin -DHEADER=N -DENTRY=ADDR -o boot.bin
;
; PVH entry state (Xen's arch-x86/hvm/start_info.h): 32-bit protected mode,
; paging off, flat CS/DS/ES/SS, EBX = physical address of hvm_start_info.

%ifndef HEADER
%error "define HEADER (sectors of start info and extent table)"
%endif
%ifndef ENTRY
%error "define ENTRY (the kernel's XEN_ELFNOTE_PHYS32_ENTRY)"
%endif

START_INFO equ 0x8000
TABLE      equ 0x9000
ATA_DATA   equ 0x1f0
ATA_STATUS equ 0x1f7
COM1       equ 0x3f8

        bits 16
        org 0x7c00
        cli
        cld
        xor ax, ax
        mov ds, ax
        mov ss, ax
        mov sp, 0x7c00
        in al, 0x92                 ; A20 on ("fast A20" of port 0x92)
        or al, 2
        and al, 0xfe                ; bit 0 would reset the machine
        out 0x92, al
        lgdt [gdt_pointer]
        mov eax, cr0
        or al, 1
        mov cr0, eax
        jmp 0x08:protected

        bits 32
protected:
        mov ax, 0x10
        mov ds, ax
        mov es, ax
        mov fs, ax
        mov gs, ax
        mov ss, ax
        mov esp, 0x7c00
        mov esi, 1                  ; the header: start info and extent table
        mov ebx, HEADER
        mov edi, START_INFO
        call read
        mov eax, TABLE
.extent:
        mov ebx, [eax + 8]
        test ebx, ebx
        jz .enter
        mov esi, [eax]
        mov edi, [eax + 4]
        push eax
        call read
        pop eax
        add eax, 12
        jmp .extent
.enter:
        mov ebx, START_INFO
        mov eax, ENTRY
        jmp eax

; read: EBX sectors from LBA ESI to EDI, at most 256 per command (a count
; of 0 means 256). Clobbers EAX, ECX, EDX, EBP; advances ESI and EDI.
read:
        test ebx, ebx
        jz .done
        mov ebp, 256
        cmp ebx, ebp
        jae .command
        mov ebp, ebx
.command:
        call wait_idle
        mov dx, 0x1f2
        mov eax, ebp
        out dx, al                  ; 0x1f2 sector count
        mov eax, esi
        inc dx
        out dx, al                  ; 0x1f3 LBA bits 0-7
        shr eax, 8
        inc dx
        out dx, al                  ; 0x1f4 LBA bits 8-15
        shr eax, 8
        inc dx
        out dx, al                  ; 0x1f5 LBA bits 16-23
        shr eax, 8
        and al, 0x0f
        or al, 0xe0                 ; LBA mode, master, LBA bits 24-27
        inc dx
        out dx, al                  ; 0x1f6
        mov al, 0x20                ; READ SECTORS
        inc dx
        out dx, al                  ; 0x1f7
        add esi, ebp
        sub ebx, ebp
.sector:
        call wait_idle
        test al, 0x01               ; ERR
        jnz fail
        test al, 0x08               ; DRQ: a sector is ready
        jz .sector
        mov dx, ATA_DATA
        mov ecx, 128
        rep insd
        dec ebp
        jnz .sector
        jmp read
.done:
        ret

; wait_idle: until the drive is not busy; AL = its status.
wait_idle:
        mov dx, ATA_STATUS
.poll:
        in al, dx
        test al, 0x80               ; BSY
        jnz .poll
        ret

; A disk error: says so on the serial console and stops.
fail:
        mov esi, message
        mov dx, COM1
.char:
        lodsb
        test al, al
        jz .stop
        out dx, al
        jmp .char
.stop:
        hlt
        jmp .stop

message db "vmx-testbed boot sector: disk read error", 13, 10, 0

        align 8
gdt:    dq 0
        dq 0x00cf9a000000ffff       ; 0x08: code, flat 4 GiB, 32-bit
        dq 0x00cf92000000ffff       ; 0x10: data, flat 4 GiB
gdt_pointer:
        dw gdt_pointer - gdt - 1
        dd gdt

        times 510 - ($ - $$) db 0
        dw 0xaa55
