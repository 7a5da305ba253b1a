/* Copies 64 KiB blocks into fresh pages (each first store faults) and checks
 * them. glibc's memcpy keeps data in vector registers across those faults,
 * so a guest kernel that loses a process's vector state when it switches to
 * another one corrupts the copies: run it beside a busy process. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

enum { BLOCK = 65536, AREA = 1 << 20, ROUNDS = 8 };

int main(void) {
    static char source[BLOCK];
    memset(source, 'a', sizeof source);
    int corrupted = 0, copies = 0;
    for (int round = 0; round < ROUNDS; round++) {
        char *area = mmap(0, AREA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (int offset = 5; offset + BLOCK <= AREA; offset += BLOCK, copies++) {
            memcpy(area + offset, source, BLOCK);
            corrupted += memcmp(area + offset, source, BLOCK) != 0;
        }
        munmap(area, AREA);
    }
    printf("corrupted copies: %d of %d\n", corrupted, copies);
    return corrupted != 0;
}
