/* Deterministic work under allocation churn: on a line, 2 threads each malloc, fill,
 * sum and free ITERATIONS blocks; "started" is printed once both are well
 * under way (so the test can kill the profiler while probes fire), then the
 * checksum when both are done; it must not depend on whether a profiler was
 * attached, or killed. Then, on a line, 16 blocks of 1 MiB are kept live
 * and "ready" printed; the next line exits with 0. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITERATIONS 400000
#define WARM 20000
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static atomic_int warm;

static void *worker(void *arg) {
    uint64_t seed = (uintptr_t)arg, sum = 0;
    for (unsigned i = 0; i < ITERATIONS; i++) {
        size_t size = 16 + (i * 7919u + seed) % 1000;
        unsigned char *p = malloc(size);
        if (!p) exit(4);
        memset(p, (int)(i + seed), size);
        for (size_t j = 0; j < size; j += 61) sum = sum * 31 + p[j];
        free(p);
        if (i == WARM) atomic_fetch_add(&warm, 1);
    }
    return (void *)(uintptr_t)sum;
}

__attribute__((noinline)) void churn_keep(void) {
    for (int i = 0; i < 16; i++) { void *p = malloc(1 << 20); ESCAPE(p); }
}

int main(void) {
    char buf[64];
    pthread_t th[2];
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    for (uintptr_t t = 0; t < 2; t++)
        if (pthread_create(&th[t], NULL, worker, (void *)(t + 1))) return 3;
    while (atomic_load(&warm) < 2) ;
    printf("started\n");
    fflush(stdout);
    uint64_t total = 0;
    for (int t = 0; t < 2; t++) {
        void *sum;
        pthread_join(th[t], &sum);
        total = total * 1000003 + (uintptr_t)sum;
    }
    printf("checksum %016llx\n", (unsigned long long)total);
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    churn_keep();
    printf("ready\n");
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    return 0;
}
