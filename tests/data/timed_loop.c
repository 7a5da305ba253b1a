/* Times a fixed user-space computation with CLOCK_MONOTONIC and prints
 * "<milliseconds> ms <checksum>". It makes no system call while computing,
 * so inside a recording the guest's clock must move without VM exits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    uint64_t rounds = argc > 1 ? strtoull(argv[1], NULL, 10) : 400000000;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    volatile uint64_t x = 1;
    for (uint64_t i = 0; i < rounds; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    clock_gettime(CLOCK_MONOTONIC, &end);
    long ms = (end.tv_sec - start.tv_sec) * 1000 + (end.tv_nsec - start.tv_nsec) / 1000000;
    printf("%ld ms %llu\n", ms, (unsigned long long)(x & 0xffff));
    return 0;
}
