/* Waits for SIGALRM while printing progress: every exit this makes is the
 * console's, taken with interrupts off in the guest kernel, so the timer
 * interrupt that raises the signal must reach the guest some other way.
 * Prints "alarm after N lines", or gives up after a bounded number. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t rang;

static void on_alarm(int signal) { (void)signal; rang = 1; }

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(1);
    int lines = 0;
    while (!rang && lines < 20000) {
        volatile unsigned spin = 0;
        while (spin < 2000000) spin++;
        printf("waiting %d\n", ++lines);
        fflush(stdout);
    }
    if (!rang) { printf("no alarm after %d lines\n", lines); return 1; }
    printf("alarm after %d lines\n", lines);
    return 0;
}
