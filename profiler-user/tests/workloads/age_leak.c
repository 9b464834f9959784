/* A true leak beside a larger churning cache. Waits for a line, leaks
 * LEAK_N blocks (never freed), fills the cache, prints "ready", then
 * replaces every cache slot about twice a second until the next line. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEAK_N 200
#define LEAK_SIZE 65536
#define CACHE_SLOTS 1024
#define CACHE_SIZE 65536

static void *cache[CACHE_SLOTS];
static volatile int stop;

__attribute__((noinline)) void *leak_site(size_t n) {
    void *p = malloc(n);
    memset(p, 1, 64);
    return p;
}

__attribute__((noinline)) void *cache_site(size_t n) {
    void *p = malloc(n);
    memset(p, 2, 64);
    return p;
}

static void *churn(void *arg) {
    (void)arg;
    while (!stop) {
        for (int i = 0; i < CACHE_SLOTS && !stop; i++) {
            free(cache[i]);
            cache[i] = cache_site(CACHE_SIZE);
            if (i % 64 == 0) usleep(30000); /* 16 pauses: ~0.5 s a sweep */
        }
    }
    return NULL;
}

int main(void) {
    char line[16];
    static void *leaked[LEAK_N];
    if (!fgets(line, sizeof line, stdin)) return 2;
    for (int i = 0; i < LEAK_N; i++) leaked[i] = leak_site(LEAK_SIZE);
    for (int i = 0; i < CACHE_SLOTS; i++) cache[i] = cache_site(CACHE_SIZE);
    pthread_t t;
    if (pthread_create(&t, NULL, churn, NULL) != 0) return 3;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    stop = 1;
    pthread_join(t, NULL);
    __asm__ volatile("" : : "r"(leaked) : "memory");
    return 0;
}
