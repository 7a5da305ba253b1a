/* Two processes count, each in a loop of its own, to COUNT (argument 1,
 * default 4000000) in memory they share, without a system call, and go on
 * counting until the other has begun; with "long" (argument 2), each pass
 * rotates a register 1000 times and back first, so that a pass is some
 * 400 times the tight loop's. Each prints, when done, how far the other
 * had come: "counter A done, B at <n>". On one CPU they interleave only
 * where the kernel preempts one for the other, at a timer tick: a
 * recording that delivers ticks at VM exits alone never ends (the first
 * waits for ever for the second to begin), and one that preempts them
 * shows the first to end seeing the second part-way. The loop's
 * registers are the same at every pass through its head: only the
 * counts in memory move, the hardest loop for a replay to find a pass
 * of. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* incq, compare with the goal and the other's count, and a TEST of a
 * constant that sets the flags the same at every pass. */
static void count_to(volatile uint64_t *count, const volatile uint64_t *other,
                     uint64_t goal) {
    __asm__ volatile("1: incq (%0)\n\t"
                     "cmpq %2, (%0)\n\t"
                     "jb 3f\n\t"
                     "cmpq $0, (%1)\n\t"
                     "jne 2f\n"
                     "3: testq %0, %0\n\t"
                     "jmp 1b\n"
                     "2:"
                     :
                     : "r"(count), "r"(other), "r"(goal)
                     : "cc", "memory");
}

/* The same, each pass rotating a register 1000 times one way and 1000
 * times back: its registers at each instruction are the same at every
 * pass. */
static void count_long_to(volatile uint64_t *count, const volatile uint64_t *other,
                          uint64_t goal) {
    uint64_t scratch = 0x0123456789abcdefULL;
    __asm__ volatile("1: incq (%1)\n\t"
                     ".rept 1000\n\t"
                     "rorq $1, %0\n\t"
                     ".endr\n\t"
                     ".rept 1000\n\t"
                     "rolq $1, %0\n\t"
                     ".endr\n\t"
                     "cmpq %3, (%1)\n\t"
                     "jb 3f\n\t"
                     "cmpq $0, (%2)\n\t"
                     "jne 2f\n"
                     "3: testq %1, %1\n\t"
                     "jmp 1b\n"
                     "2:"
                     : "+r"(scratch)
                     : "r"(count), "r"(other), "r"(goal)
                     : "cc", "memory");
}

int main(int argc, char **argv) {
    uint64_t goal = argc > 1 ? strtoull(argv[1], NULL, 10) : 4000000;
    volatile uint64_t *counts =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (counts == MAP_FAILED)
        return 1;
    pid_t child = fork();
    if (child < 0)
        return 1;
    int me = child == 0;
    if (argc > 2 && argv[2][0] == 'l')
        count_long_to(&counts[me], &counts[1 - me], goal);
    else
        count_to(&counts[me], &counts[1 - me], goal);
    printf("counter %c done, %c at %llu\n", 'A' + me, 'B' - me,
           (unsigned long long)counts[1 - me]);
    fflush(stdout);
    if (child == 0)
        return 0;
    waitpid(child, NULL, 0);
    return 0;
}
