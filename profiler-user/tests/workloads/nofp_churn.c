/* Allocation churn in code built -O2 -fomit-frame-pointer: on a line, 2
 * threads each malloc (through one helper, one call site), fill and free
 * ITERATIONS blocks, then "done" is printed; the next line exits. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITERATIONS 200000
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void *churn_alloc(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    ESCAPE(p);
    return p;
}

static void *worker(void *arg) {
    uint64_t seed = (uintptr_t)arg;
    for (unsigned i = 0; i < ITERATIONS; i++) {
        size_t size = 16 + (i * 7919u + seed) % 1000;
        unsigned char *p = churn_alloc(size);
        memset(p, (int)(i + seed), size);
        ESCAPE(p);
        free(p);
    }
    return NULL;
}

int main(void) {
    char buf[64];
    pthread_t th[2];
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    for (uintptr_t t = 0; t < 2; t++)
        if (pthread_create(&th[t], NULL, worker, (void *)(t + 1))) return 3;
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    printf("done\n");
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    return 0;
}
