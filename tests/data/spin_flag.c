/* A thread that waits by spinning: the main thread goes round a loop that
 * reads a flag, with no system call, until a second thread, which computes
 * for a while first, sets it. Prints "flag set after the work <checksum>".
 * The setter starts its work only once the spinner spins (it yields the
 * CPU until then), so on one CPU it runs only when the spinner is
 * preempted, whichever thread the kernel ran first: a recording that
 * preempts nothing would spin for ever. The loop's registers and memory
 * are the same at every pass. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static volatile int flag, spinning;
static volatile uint64_t result;
static uint64_t rounds = 2000000;

static void *set_flag(void *unused) {
    (void)unused;
    while (!spinning)
        sched_yield();
    uint64_t x = 1;
    for (uint64_t i = 0; i < rounds; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    result = x;
    flag = 1;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        rounds = strtoull(argv[1], NULL, 10);
    pthread_t setter;
    pthread_create(&setter, NULL, set_flag, NULL);
    spinning = 1;
    while (!flag)
        ;
    pthread_join(setter, NULL);
    printf("flag set after the work %llu\n", (unsigned long long)(result & 0xffff));
    return 0;
}
