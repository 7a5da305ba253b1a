/* Prints the time-stamp counter as guest user mode reads it. Where the
 * hypervisor honours CR4.TSD, provm's guest kernel answers RDTSC from the
 * VMM's logged clock and a replay matches; where it does not (PVM), RDTSC
 * in guest ring 3 returns host time that never crosses the VMM, and a
 * recorded run that prints it must be reported as diverging. */
#include <stdio.h>
#include <x86intrin.h>

int main(void)
{
	printf("%llu\n", (unsigned long long)__rdtsc());
	return 0;
}
