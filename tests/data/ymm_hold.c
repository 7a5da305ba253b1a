/* Holds a pattern of its own in all sixteen YMM registers across a busy loop
 * with no system call, then checks it, round after round; between rounds it
 * yields the CPU with a system call. Run two at once (different SEEDs): a
 * guest kernel that switches processes in the middle of a loop and saves
 * only their SSE state gives each the other's upper halves.
 * Usage: ymm_hold SEED */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "avx_runs.h"

enum { REGISTERS = 16, LANES = 4, ROUNDS = 20 };
/* About 10 ms of spinning per round natively, a tick of the guest's 100 Hz
 * timer, so that most rounds are preempted midway (and many times that
 * under emulation). */
static const uint64_t SPINS = 30000000;

typedef uint64_t Registers[REGISTERS][LANES];

/* Loads `in` into YMM0-15, spins, and stores them into `out`. One asm
 * statement, so that the compiler puts nothing in the registers meanwhile. */
static void hold(const Registers in, Registers out) {
    uint64_t spins = SPINS;
#define LOAD(n) "vmovdqu " #n "*32(%[in]), %%ymm" #n "\n\t"
#define STORE(n) "vmovdqu %%ymm" #n ", " #n "*32(%[out])\n\t"
#define ALL(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) \
    op(8) op(9) op(10) op(11) op(12) op(13) op(14) op(15)
    __asm__ volatile(ALL(LOAD) "1: dec %[spins]\n\tjnz 1b\n\t" ALL(STORE) "vzeroupper"
                     : [spins] "+r"(spins)
                     : [in] "r"(in), [out] "r"(out)
                     : "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
                       "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",
                       "xmm14", "xmm15");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ymm_hold SEED\n");
        return 2;
    }
    if (!avx_runs()) {
        printf("no AVX in user space: nothing to check\n");
        return 2;
    }
    uint64_t seed = strtoull(argv[1], 0, 0);
    static Registers pattern, seen;
    for (int r = 0; r < REGISTERS; r++)
        for (int lane = 0; lane < LANES; lane++)
            pattern[r][lane] = seed << 32 | (uint64_t)r << 8 | lane;
    memset(seen, 0, sizeof seen); /* its pages are present before the loop */
    int corrupted = 0;
    for (int round = 0; round < ROUNDS; round++) {
        hold(pattern, seen);
        corrupted += memcmp(pattern, seen, sizeof seen) != 0;
        sched_yield();
    }
    printf("ymm_hold %s: corrupted rounds: %d of %d\n", argv[1], corrupted, ROUNDS);
    return corrupted != 0;
}
