/* Whether this process can execute AVX instructions: tried, not asked of
 * CPUID, which on PVM says no (the guest kernel's OSXSAVE is clear) where
 * the CPU runs them all the same (the host's XCR0 is in force). Included
 * by the programs that check what happens to YMM registers. */
#include <setjmp.h>
#include <signal.h>

static sigjmp_buf no_avx;

static void on_sigill(int signal) {
    (void)signal;
    siglongjmp(no_avx, 1);
}

static int avx_runs(void) {
    struct sigaction action = {.sa_handler = on_sigill}, old;
    sigaction(SIGILL, &action, &old);
    int runs = !sigsetjmp(no_avx, 1);
    if (runs)
        __asm__ volatile("vxorps %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");
    sigaction(SIGILL, &old, 0);
    return runs;
}
