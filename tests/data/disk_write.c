/* disk_write check|ignore FILE BYTE: writes one 4 KiB block of BYTE to
 * FILE with O_DIRECT, so that the write reaches the disk at once as one
 * virtio-blk request and write() itself sees the disk's answer, then
 * prints "wrote FILE". `check` reports a failed write and exits 1;
 * `ignore` never looks at what write() returned. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 4096

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: disk_write check|ignore FILE BYTE\n");
        return 2;
    }
    int check = strcmp(argv[1], "check") == 0;
    void *block;
    if (posix_memalign(&block, BLOCK, BLOCK) != 0)
        return 2;
    memset(block, argv[3][0], BLOCK);
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) {
        perror(argv[2]);
        return 1;
    }
    ssize_t written = write(fd, block, BLOCK);
    if (check && written != BLOCK) {
        perror("disk_write: write");
        return 1;
    }
    if (check && close(fd) != 0) {
        perror("disk_write: close");
        return 1;
    }
    printf("wrote %s\n", argv[2]);
    return 0;
}
