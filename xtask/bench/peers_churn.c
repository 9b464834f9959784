/* `cargo xtask bench peers`: the synthetic workload.
 *
 * peers_churn THREADS STEPS: waits for a line on stdin (so that a profiler
 * can attach first), then each of THREADS threads fills 20,000 live slots
 * and replaces a random one STEPS times (one free + one malloc per step):
 * 95% of sizes 8-256 B, 5% 257 B-16 KiB; every block is touched. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { SLOTS = 20000 };
static long steps;

static inline uint64_t xs(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t size_of(uint64_t r) {
    return (r >> 32) % 100 < 95 ? 8 + (r >> 40) % 249 : 257 + (r >> 40) % (16384 - 256);
}

static void *churn(void *arg) {
    uint64_t s = 0x9e3779b97f4a7c15ull * (1 + (uintptr_t)arg);
    void **slot = malloc(SLOTS * sizeof *slot);
    for (int i = 0; i < SLOTS; i++) {
        slot[i] = malloc(size_of(xs(&s)));
        *(volatile char *)slot[i] = 1;
    }
    for (long i = 0; i < steps; i++) {
        uint64_t r = xs(&s);
        unsigned k = (unsigned)(r % SLOTS);
        free(slot[k]);
        slot[k] = malloc(size_of(r));
        *(volatile char *)slot[k] = 1;
    }
    for (int i = 0; i < SLOTS; i++) free(slot[i]);
    free(slot);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: peers_churn THREADS STEPS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    steps = atol(argv[2]);
    char go[16];
    if (read(0, go, sizeof go) <= 0) return 1;
    pthread_t th[64];
    if (threads < 1 || threads > 64) return 2;
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, churn, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    return 0;
}
