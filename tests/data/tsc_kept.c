/* Keeps the time-stamp counter as user mode reads it on its stack, then
 * reads the guest's clock through the kernel as many times as its argument
 * says: each read is a VM exit (the clock is the VMM's device), where the
 * recording checks memory while this process runs. It prints nothing, so
 * where RDTSC is not logged (PVM) only its memory differs in a replay, and
 * the explanation names this process, its stack's page and its backtrace:
 * built with frame pointers, read_clock's frame links to main's. */
#pragma GCC optimize("no-omit-frame-pointer")
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <x86intrin.h>

/* The system call itself, not glibc's wrapper (which may use the vDSO,
 * or RBP): the saved user registers then hold this frame's RBP. */
__attribute__((noinline)) static void read_clock(void)
{
	struct timespec now;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"((long)SYS_clock_gettime), "D"((long)CLOCK_MONOTONIC), "S"(&now)
			 : "rcx", "r11", "memory");
}

int main(int argc, char **argv)
{
	volatile uint64_t kept = __rdtsc();
	long reads = argc > 1 ? strtol(argv[1], NULL, 10) : 1000;
	for (long i = 0; i < reads; i++)
		read_clock();
	return (int)(kept & 0);
}
