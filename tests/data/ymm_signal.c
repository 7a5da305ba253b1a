/* Holds a pattern in YMM7 across a getppid() system call and a short spin,
 * round after round, while a SIGALRM handler sets YMM7 to all ones every
 * millisecond. A kernel that saves the whole AVX state in the signal frame
 * (XSAVE) gives the interrupted code its pattern back at sigreturn; one
 * that saves only the SSE state (provm's guest kernel where it has no
 * XSAVE: PVM) leaves the handler's upper half in it. Runs until SIGNALS
 * signals were handled (or a million rounds), then prints how many rounds
 * saw their pattern changed.
 * Usage: ymm_signal SIGNALS */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>

#include "avx_runs.h"

enum { MAX_ROUNDS = 1000000 };
/* Spins per round after the system call: a few microseconds, so that the
 * timer's interrupts land while the pattern is held. */
static const uint64_t SPINS = 20000;

static volatile sig_atomic_t signals;

static void on_alarm(int signal) {
    (void)signal;
    __asm__ volatile("vpcmpeqd %%ymm7, %%ymm7, %%ymm7" ::: "xmm7");
    signals++;
}

/* Loads `in` into YMM7, makes the system call, spins, and stores YMM7 into
 * `out`: one asm statement, so that nothing else uses the register. */
static void hold(const uint64_t in[4], uint64_t out[4]) {
    uint64_t spins = SPINS;
    __asm__ volatile("vmovdqu (%[in]), %%ymm7\n\t"
                     "mov %[nr], %%eax\n\t"
                     "syscall\n\t"
                     "1: dec %[spins]\n\t"
                     "jnz 1b\n\t"
                     "vmovdqu %%ymm7, (%[out])\n\t"
                     "vzeroupper"
                     : [spins] "+r"(spins)
                     : [in] "r"(in), [out] "r"(out), [nr] "i"(SYS_getppid)
                     : "rax", "rcx", "r11", "memory", "xmm7");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ymm_signal SIGNALS\n");
        return 2;
    }
    if (!avx_runs()) {
        printf("no AVX in user space: nothing to check\n");
        return 2;
    }
    int wanted = atoi(argv[1]);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_alarm;
    action.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &action, 0);
    struct itimerval every = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &every, 0);
    static const uint64_t pattern[4] = {0x0123456789abcdef, 0x1122334455667788,
                                        0x99aabbccddeeff00, 0x0f1e2d3c4b5a6978};
    uint64_t seen[4];
    int rounds = 0, corrupted = 0;
    while (signals < wanted && rounds < MAX_ROUNDS) {
        hold(pattern, seen);
        rounds++;
        corrupted += memcmp(pattern, seen, sizeof seen) != 0;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, 0);
    printf("ymm_signal: %d signals, corrupted rounds: %d\n", (int)signals, corrupted);
    return 0;
}
