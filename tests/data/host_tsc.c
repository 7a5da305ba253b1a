/* Prints the time-stamp counter as guest user mode reads it. Where the
 * hypervisor does not honour CR4.TSD (PVM), RDTSC in guest ring 3 returns
 * host time that never crosses the VMM: a recorded run that prints it must
 * be reported as diverging when replayed. */
#include <stdio.h>
#include <x86intrin.h>

int main(void)
{
	printf("%llu\n", (unsigned long long)__rdtsc());
	return 0;
}
