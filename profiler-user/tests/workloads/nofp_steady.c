/* Allocates from its start until told to stop, built by tests/unwind.rs
 * without frame pointers: main -> steady_loop -> steady_site -> malloc,
 * each block filled and freed at once. Prints "started" once it runs; a
 * line on stdin stops the loop, then "done" is printed and the next line
 * exits. (A process that samples while allocprof attaches to it.) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static atomic_int stop;

__attribute__((noinline)) void *steady_site(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    ESCAPE(p);
    return p;
}

__attribute__((noinline)) void steady_loop(void) {
    for (unsigned i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        size_t size = 4096 + (i * 7919u) % 4096;
        unsigned char *p = steady_site(size);
        memset(p, (int)i, size);
        ESCAPE(p);
        free(p);
    }
}

static void *waiter(void *arg) {
    char buf[64];
    (void)arg;
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
    atomic_store(&stop, 1);
    return NULL;
}

int main(void) {
    char buf[64];
    pthread_t t;
    if (pthread_create(&t, NULL, waiter, NULL)) return 3;
    printf("started\n");
    fflush(stdout);
    steady_loop();
    pthread_join(t, NULL);
    printf("done\n");
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    return 0;
}
