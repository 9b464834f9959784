/* free preserves errno, also when the allocator's free reaches a syscall
 * that fails or otherwise touches errno. The program interposes madvise,
 * munmap and mprotect (a shared library's calls to them bind to these
 * definitions in the executable) with versions that do the real syscall
 * and then clobber errno, and counts the calls made from inside free.
 * Run with ALLOCPROF_RATE=0 (unsampled blocks) and =1 (all sampled).
 * Prints "errno ok: frees=N syscalls_in_free=M". */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile long calls;
static const int CLOBBER = EHWPOISON;

int madvise(void *a, size_t n, int advice) {
    long r = syscall(SYS_madvise, a, n, advice);
    calls++;
    errno = CLOBBER;
    return (int)r;
}
int munmap(void *a, size_t n) {
    long r = syscall(SYS_munmap, a, n);
    calls++;
    errno = CLOBBER;
    return (int)r;
}
int mprotect(void *a, size_t n, int prot) {
    long r = syscall(SYS_mprotect, a, n, prot);
    calls++;
    errno = CLOBBER;
    return (int)r;
}

static long frees, in_free;

static void checked_free(void *p, size_t size) {
    long before = calls;
    errno = 4321;
    free(p);
    if (errno != 4321) {
        fprintf(stderr, "free of a %zu-byte block changed errno to %d\n", size, errno);
        exit(1);
    }
    frees++;
    in_free += calls - before;
}

static void nap(void) {
    struct timespec t = {0, 20 * 1000 * 1000};
    nanosleep(&t, NULL);
}

int main(void) {
    static void *blocks[64];
    const size_t sizes[] = {16, 100, 3000, 5000, 20000, 200000, 1 << 20, 5 << 20, 40 << 20};
    for (int round = 0; round < 6; round++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            for (int i = 0; i < 64; i++) {
                blocks[i] = malloc(sizes[s]);
                if (!blocks[i]) { fprintf(stderr, "malloc failed\n"); return 1; }
                memset(blocks[i], 1, sizes[s] < 8192 ? sizes[s] : 8192);
            }
            for (int i = 0; i < 64; i++) checked_free(blocks[i], sizes[s]);
        }
        /* Let mimalloc's delayed purge (default 10 ms) come due, so that
         * later frees run it. */
        nap();
    }
    checked_free(NULL, 0);
    printf("errno ok: frees=%ld syscalls_in_free=%ld\n", frees, in_free);
    return 0;
}
