/* Keeps the time-stamp counter as user mode reads it on its stack, then
 * computes in user mode, making no system call, for as many rounds as its
 * argument says: long enough for the recording's periodic state checks to
 * stop it there. It prints nothing, so where RDTSC is not logged (PVM) only
 * its memory differs in a replay, and the explanation names this process,
 * its stack's page and its backtrace: built with frame pointers, spin's
 * frame links to main's. */
#pragma GCC optimize("no-omit-frame-pointer")
#include <stdint.h>
#include <stdlib.h>
#include <x86intrin.h>

__attribute__((noinline)) static uint64_t spin(uint64_t rounds)
{
	volatile uint64_t x = 1;
	for (uint64_t i = 0; i < rounds; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	return x;
}

int main(int argc, char **argv)
{
	volatile uint64_t kept = __rdtsc();
	uint64_t rounds = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000000;
	return (int)((spin(rounds) ^ kept) & 0);
}
