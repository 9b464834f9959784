/* Target side of `cargo xtask bench pipeline`, run under LD_PRELOAD with
 * ALLOCPROF_RATE=1 so that every allocation is a sampled event.
 *   cost N          time N sampled mallocs, then their N frees
 *   cost2 N         `cost N` in 2 threads at once (sharing the process's
 *                   counters and the kernel's maps): their mean
 *   rate EPS SECS   EPS sampled events per second (malloc+free pairs) for SECS
 *   max SECS THR    THR threads of malloc/free pairs as fast as they go
 *   deep N DEPTH    `cost N` at the bottom of DEPTH nested calls (built with
 *                   and without frame pointers: the unwinder's cost)
 * Each mode waits for a line on stdin before starting (so the profiler can
 * attach), prints its results as `key value` lines then `end`, and waits for
 * another line before exiting (so the harness can read kernel statistics
 * while the profiler is still attached). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
}

static void cost(long n) {
    void **p = malloc(n * sizeof *p);
    double t0 = now();
    for (long i = 0; i < n; i++) { p[i] = malloc(64); ESCAPE(p[i]); }
    double t1 = now();
    for (long i = 0; i < n; i++) free(p[i]);
    double t2 = now();
    printf("alloc_ns %.1f\nfree_ns %.1f\n", (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9);
}

static long cost2_n;
static pthread_barrier_t cost2_start;
static double cost2_alloc[2], cost2_free[2];

static void *cost2_thread(void *arg) {
    long k = (long)arg, n = cost2_n;
    void **p = malloc(n * sizeof *p);
    pthread_barrier_wait(&cost2_start);
    double t0 = now();
    for (long i = 0; i < n; i++) { p[i] = malloc(64); ESCAPE(p[i]); }
    double t1 = now();
    for (long i = 0; i < n; i++) free(p[i]);
    double t2 = now();
    cost2_alloc[k] = (t1 - t0) / n * 1e9;
    cost2_free[k] = (t2 - t1) / n * 1e9;
    free(p);
    return 0;
}

static void cost2(long n) {
    pthread_t t[2];
    cost2_n = n;
    pthread_barrier_init(&cost2_start, 0, 2);
    for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, cost2_thread, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
    printf("alloc_ns %.1f\nfree_ns %.1f\n", (cost2_alloc[0] + cost2_alloc[1]) / 2,
           (cost2_free[0] + cost2_free[1]) / 2);
}

static void rate(long eps, double secs) {
    /* Bursts every millisecond keep the rate steady without busy waiting. */
    long per_ms = eps / 2 / 1000;
    double start = now(), next = start;
    long pairs = 0;
    while (now() - start < secs) {
        for (long i = 0; i < per_ms; i++) { void *q = malloc(64); ESCAPE(q); free(q); }
        pairs += per_ms;
        next += 0.001;
        double wait = next - now();
        if (wait > 0) {
            struct timespec ts = {0, (long)(wait * 1e9)};
            nanosleep(&ts, 0);
        }
    }
    printf("events_per_sec %.0f\n", 2.0 * pairs / (now() - start));
}

/* No tail call, no recursion turned into a loop: a frame per level. */
__attribute__((noinline, noclone)) static void deep(long n, int depth) {
    if (depth == 0) {
        cost(n);
        return;
    }
    deep(n, depth - 1);
    __asm__ volatile("" ::: "memory");
}

static double max_secs;
static void *churn(void *arg) {
    long *pairs = arg;
    double start = now();
    while (now() - start < max_secs) {
        for (int i = 0; i < 1000; i++) { void *q = malloc(64); ESCAPE(q); free(q); }
        *pairs += 1000;
    }
    return 0;
}

static void max_rate(double secs, int threads) {
    pthread_t t[64];
    long pairs[64] = {0};
    max_secs = secs;
    double start = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, churn, &pairs[i]);
    long total = 0;
    for (int i = 0; i < threads; i++) { pthread_join(t[i], 0); total += pairs[i]; }
    printf("events_per_sec %.0f\n", 2.0 * total / (now() - start));
}

int main(int argc, char **argv) {
    if (argc < 3) return 64;
    wait_line();
    if (!strcmp(argv[1], "cost")) cost(atol(argv[2]));
    else if (!strcmp(argv[1], "cost2")) cost2(atol(argv[2]));
    else if (!strcmp(argv[1], "rate") && argc == 4) rate(atol(argv[2]), atof(argv[3]));
    else if (!strcmp(argv[1], "max") && argc == 4) max_rate(atof(argv[2]), atoi(argv[3]));
    else if (!strcmp(argv[1], "deep") && argc == 4) deep(atol(argv[2]), atoi(argv[3]));
    else return 64;
    printf("end\n");
    fflush(stdout);
    wait_line();
    return 0;
}
