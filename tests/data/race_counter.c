/* Four threads add to one counter without a lock: each reads it, makes a
 * system call that reads the clock (a VM exit under provm, where it may
 * switch vCPUs), and writes it back plus one. Prints the final count,
 * "race <count>", which is 4 * ROUNDS only if no update was lost. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define THREADS 4

static volatile long counter;
static long rounds = 2000;

static void *add(void *unused) {
    (void)unused;
    for (long i = 0; i < rounds; i++) {
        long seen = counter;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        counter = seen + 1;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        rounds = strtol(argv[1], NULL, 10);
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, add, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    printf("race %ld\n", counter);
    return 0;
}
