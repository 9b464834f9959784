/* Allocates and frees without pause on argv[1] threads (default 4), each
 * keeping its last 256 blocks live: a target whose probes fire all the time.
 * Prints "running" once every thread has allocated, then runs until killed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define KEPT 256
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static atomic_int warm;

__attribute__((noinline)) void hammer_site(void **kept, unsigned i) {
    free(kept[i % KEPT]);
    kept[i % KEPT] = malloc(32 + (i % 16) * 32);
    ESCAPE(kept[i % KEPT]);
}

static void *worker(void *arg) {
    (void)arg;
    void *kept[KEPT] = {0};
    for (unsigned i = 0;; i++) {
        hammer_site(kept, i);
        if (i == 1000) atomic_fetch_add(&warm, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    for (int t = 0; t < threads; t++) {
        pthread_t th;
        if (pthread_create(&th, NULL, worker, NULL)) return 3;
    }
    while (atomic_load(&warm) < threads) usleep(1000);
    printf("running\n");
    fflush(stdout);
    for (;;) pause();
}
