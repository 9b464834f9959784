/* many_maps: a process with MAPS mappings (30000 by default: one region of
 * pages whose protections alternate) whose THREADS threads (200 by
 * default) each make one allocation (sampled: run with ALLOCPROF_RATE=1).
 * Prints "maps M rchar R us T": the process's mappings, the bytes it read
 * (rchar of /proc/self/io) and the microseconds while the threads ran. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static unsigned long rchar(void) {
    char buf[512];
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return 0;
    unsigned long v = 0;
    while (fgets(buf, sizeof buf, f))
        if (sscanf(buf, "rchar: %lu", &v) == 1) break;
    fclose(f);
    return v;
}

static long count_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void *one_alloc(void *arg) {
    (void)arg;
    char *p = malloc(64);
    if (p) p[0] = 1;
    free(p);
    return NULL;
}

int main(void) {
    const char *m = getenv("MAPS"), *t = getenv("THREADS");
    long maps = m ? atol(m) : 30000;
    int threads = t ? atoi(t) : 200;
    long page = sysconf(_SC_PAGESIZE);
    char *region = mmap(NULL, maps * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 2;
    for (long i = 1; i < maps; i += 2)
        if (mprotect(region + i * page, page, PROT_READ) != 0) return 3;
    pthread_t *tid = calloc(threads, sizeof *tid);
    long total = count_maps();
    unsigned long before = rchar();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[i], NULL, one_alloc, NULL) != 0) return 4;
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    unsigned long after = rchar();
    long us = (b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000;
    printf("maps %ld rchar %lu us %ld\n", total, after - before, us);
    return 0;
}
