/* A glibc heap with a million free chunks (two million 136-byte blocks,
 * above the fastbins' sizes, every other one freed), then 20,000 allocations of 1,000 bytes: at
 * ALLOCPROF_RATE=4k about a fifth are sampled. Prints the slowest single
 * malloc of those in this thread's CPU time, which a busy machine's
 * preemptions do not inflate (for the record: nothing asserts a time), and
 * the number of samples: "slowest_malloc_cpu_us=T sampled=N". argv[1], if
 * given, is a pause in seconds before those allocations (past the back-off
 * of a library that refreshes costly statistics at a sampled malloc). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SMALL 2000000
#define LOOPS 20000

struct stats { uint64_t sampled, unplaced, freed, live_pages; };

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    void **small = malloc(SMALL * sizeof *small);
    if (!small) return 1;
    for (int i = 0; i < SMALL; i++)
        if (!(small[i] = malloc(136))) return 1;
    for (int i = 0; i < SMALL; i += 2) free(small[i]);
    if (argc > 1) sleep(atoi(argv[1]));
    static void *big[LOOPS];
    double slowest = 0;
    for (int i = 0; i < LOOPS; i++) {
        double t0 = now_us();
        big[i] = malloc(1000);
        double dt = now_us() - t0;
        if (!big[i]) return 1;
        if (dt > slowest) slowest = dt;
    }
    for (int i = 0; i < LOOPS; i++) free(big[i]);
    for (int i = 1; i < SMALL; i += 2) free(small[i]);
    free(small);
    struct stats s = {0};
    void (*f)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (f) f(&s);
    printf("slowest_malloc_cpu_us=%.0f sampled=%lu\n", slowest, (unsigned long)s.sampled);
    return 0;
}
