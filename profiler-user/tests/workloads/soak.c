/* The soak workload: a churn at a steady rate on one thread, and a leak the
 * harness drives on the main thread, so the leak's truth is known exactly.
 *   stdin "leak N"  leaks N blocks of LEAK_SIZE (never freed), replies
 *                   "leaked TOTAL_BLOCKS";
 *   stdin "exit"    prints the churn's operation count and exits.
 * The churn replaces random slots of a ring with blocks of random sizes
 * (16 B to 4 KiB, and 1 in 64 up to 64 KiB) at about OPS_PER_SEC. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")
#define LEAK_SIZE 16384
#define RING 4096
#define OPS_PER_SEC 100000
#define BATCH 1000

static atomic_long churn_ops;
static atomic_int stop;

__attribute__((noinline)) void *churn_small(size_t n) { return malloc(n); }
__attribute__((noinline)) void *churn_large(size_t n) { return malloc(n); }

static void *churn(void *arg) {
    (void)arg;
    static void *ring[RING];
    unsigned seed = 12345;
    struct timespec pause = {0, 1000000000L / (OPS_PER_SEC / BATCH)};
    while (!atomic_load(&stop)) {
        for (int i = 0; i < BATCH; i++) {
            unsigned r = rand_r(&seed);
            unsigned slot = r % RING;
            free(ring[slot]);
            ring[slot] = (r >> 12) % 64 == 0 ? churn_large(16 + (r >> 6) % 65536)
                                             : churn_small(16 + (r >> 6) % 4096);
            ESCAPE(ring[slot]);
        }
        atomic_fetch_add(&churn_ops, BATCH);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

__attribute__((noinline)) void leak_block(void) {
    char *p = malloc(LEAK_SIZE);
    memset(p, 1, 64);
    ESCAPE(p);
}

int main(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, churn, NULL)) return 3;
    char line[64];
    long leaked = 0;
    while (fgets(line, sizeof line, stdin)) {
        long n;
        if (sscanf(line, "leak %ld", &n) == 1) {
            for (long i = 0; i < n; i++) leak_block();
            leaked += n;
            printf("leaked %ld\n", leaked);
            fflush(stdout);
        } else if (strncmp(line, "exit", 4) == 0) {
            break;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("churn %ld\n", atomic_load(&churn_ops));
    return 0;
}
