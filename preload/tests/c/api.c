/* Semantics of every exported allocation function, run under LD_PRELOAD.
 * Exit status 0 = all checks passed; the first failure is printed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#include "check.h"

struct stats { uint64_t sampled, unplaced, freed, live_pages; };

static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed + i * 31);
}
static int check_fill(const void *p, size_t n, unsigned seed) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed + i * 31)) return 0;
    return 1;
}
static int aligned(void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }
/* Fundamental alignment: 16 bytes, or less for blocks too small to hold a
 * 16-byte type (mimalloc hands out 8-byte aligned 8-byte blocks). */
static int malloc_aligned(void *p, size_t n) { return aligned(p, n >= 16 ? 16 : 8); }

int main(void) {
    const size_t sizes[] = {1, 7, 16, 24, 100, 255, 4095, 4096, 4097, 65536, 100000, 1 << 20, 3 << 20};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];

    /* malloc / free / usable size, errno preserved by free. */
    CHECK(malloc_usable_size(NULL) == 0);
    for (size_t i = 0; i < nsizes; i++) {
        void *p = malloc(sizes[i]);
        CHECK(p != NULL && malloc_aligned(p, sizes[i]));
        size_t u = malloc_usable_size(p);
        CHECK(u >= sizes[i]);
        fill(p, u, (unsigned)i);
        CHECK(check_fill(p, u, (unsigned)i));
        errno = 1234;
        free(p);
        CHECK(errno == 1234);
    }
    void *z = malloc(0);
    CHECK(z != NULL);
    free(z);
    errno = 1234;
    free(NULL);
    CHECK(errno == 1234);

    errno = 0;
    CHECK(malloc(SIZE_MAX / 2) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(malloc(SIZE_MAX) == NULL && errno == ENOMEM);

    /* calloc zeroes, even for recycled blocks, and detects overflow. */
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < nsizes; i++) {
            void *d = malloc(sizes[i]);
            memset(d, 0xa5, sizes[i]);
            free(d);
            unsigned char *c = calloc(1, sizes[i]);
            CHECK(c != NULL);
            for (size_t j = 0; j < sizes[i]; j++) CHECK(c[j] == 0);
            free(c);
        }
    }
    unsigned char *c2 = calloc(1000, 8);
    CHECK(c2 != NULL);
    for (size_t j = 0; j < 8000; j++) CHECK(c2[j] == 0);
    free(c2);
    errno = 0;
    CHECK(calloc(SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
    void *c0 = calloc(0, 5);
    CHECK(c0 != NULL);
    free(c0);

    /* realloc: NULL = malloc, grow/shrink keep content, 0 frees, failure
     * leaves the old block intact. */
    void *r = realloc(NULL, 10);
    CHECK(r != NULL);
    fill(r, 10, 3);
    size_t prev = 10;
    for (size_t i = 0; i < nsizes; i++) {
        size_t keep = sizes[i] < prev ? sizes[i] : prev;
        prev = sizes[i];
        r = realloc(r, sizes[i]);
        CHECK(r != NULL && malloc_aligned(r, sizes[i]));
        CHECK(check_fill(r, keep, 3));
        CHECK(malloc_usable_size(r) >= sizes[i]);
        fill(r, sizes[i], 3);
    }
    for (size_t i = nsizes; i-- > 0;) {
        r = realloc(r, sizes[i]);
        CHECK(r != NULL);
        CHECK(check_fill(r, sizes[i], 3));
    }
    /* Data up to malloc_usable_size survives a realloc. */
    size_t u = malloc_usable_size(r);
    fill(r, u, 9);
    r = realloc(r, u + 1000);
    CHECK(r != NULL && check_fill(r, u, 9));
    errno = 0;
    CHECK(realloc(r, SIZE_MAX / 2) == NULL && errno == ENOMEM);
    CHECK(check_fill(r, u, 9));
    CHECK(realloc(r, 0) == NULL); /* glibc: frees r */

    /* reallocarray */
    int *a = reallocarray(NULL, 10, sizeof(int));
    CHECK(a != NULL);
    for (int i = 0; i < 10; i++) a[i] = i;
    a = reallocarray(a, 1000, sizeof(int));
    CHECK(a != NULL);
    for (int i = 0; i < 10; i++) CHECK(a[i] == i);
    errno = 0;
    CHECK(reallocarray(a, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
    for (int i = 0; i < 10; i++) CHECK(a[i] == i);
    free(a);

    /* posix_memalign: EINVAL for bad alignment, errno never touched. */
    void *pm = (void *)1;
    errno = 77;
    CHECK(posix_memalign(&pm, 3, 16) == EINVAL && pm == (void *)1);
    CHECK(posix_memalign(&pm, 4, 16) == EINVAL && pm == (void *)1);
    CHECK(posix_memalign(&pm, 24, 16) == EINVAL && pm == (void *)1);
    CHECK(posix_memalign(&pm, 64, SIZE_MAX / 2) == ENOMEM && pm == (void *)1);
    CHECK(errno == 77);
    const size_t aligns[] = {8, 16, 32, 64, 256, 4096, 8192, 65536, 1 << 21};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        for (size_t j = 0; j < nsizes; j++) {
            CHECK(posix_memalign(&pm, aligns[i], sizes[j]) == 0);
            CHECK(aligned(pm, aligns[i]) && malloc_usable_size(pm) >= sizes[j]);
            fill(pm, sizes[j], 5);
            void *m = memalign(aligns[i], sizes[j]);
            CHECK(m != NULL && aligned(m, aligns[i]));
            void *aa = aligned_alloc(aligns[i], sizes[j]);
            CHECK(aa != NULL && aligned(aa, aligns[i]));
            fill(m, sizes[j], 6);
            fill(aa, sizes[j], 7);
            CHECK(check_fill(pm, sizes[j], 5));
            /* An aligned block can be realloc'd. */
            pm = realloc(pm, sizes[j] * 2);
            CHECK(pm != NULL && check_fill(pm, sizes[j], 5));
            free(pm);
            free(m);
            free(aa);
        }
    }
    void *m48 = memalign(48, 10); /* glibc rounds to the next power of two */
    CHECK(m48 != NULL && aligned(m48, 64));
    free(m48);
    errno = 0;
    CHECK(memalign(SIZE_MAX / 2 + 2, 10) == NULL && errno == EINVAL);

    long page = sysconf(_SC_PAGESIZE);
    void *v = valloc(10);
    CHECK(v != NULL && aligned(v, (size_t)page));
    free(v);
    void *pv = pvalloc(1);
    CHECK(pv != NULL && aligned(pv, (size_t)page) && malloc_usable_size(pv) >= (size_t)page);
    memset(pv, 1, (size_t)page);
    free(pv);
    errno = 0;
    CHECK(pvalloc(SIZE_MAX - 10) == NULL && errno == ENOMEM);

    /* cfree is a compat-only symbol: not linkable, reachable via dlsym. */
    void (*cfree_fn)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "cfree");
    CHECK(cfree_fn != NULL);
    cfree_fn(malloc(33));

    /* Churn with content checks. */
    enum { SLOTS = 512 };
    static void *live[SLOTS];
    static size_t len[SLOTS];
    unsigned rng = 12345;
    for (int it = 0; it < 100000; it++) {
        rng = rng * 1103515245u + 12345u;
        int k = (rng >> 8) % SLOTS;
        if (live[k]) {
            CHECK(check_fill(live[k], len[k], (unsigned)k));
            if (rng & 1) {
                free(live[k]);
                live[k] = NULL;
                continue;
            }
            size_t n = ((rng >> 16) % 5000) + 1;
            void *q = realloc(live[k], n);
            CHECK(q != NULL);
            size_t keep = n < len[k] ? n : len[k];
            CHECK(check_fill(q, keep, (unsigned)k));
            live[k] = q;
            len[k] = n;
            fill(q, n, (unsigned)k);
        } else {
            size_t n = ((rng >> 16) % ((rng & 0x100) ? 70000 : 300)) + 1;
            live[k] = (rng & 2) ? calloc(1, n) : malloc(n);
            CHECK(live[k] != NULL);
            len[k] = n;
            fill(live[k], n, (unsigned)k);
        }
    }
    for (int k = 0; k < SLOTS; k++) free(live[k]);

    /* Under ALLOCPROF_RATE=1 everything fits the region: check it was used. */
    void (*stats_fn)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    CHECK(stats_fn != NULL);
    struct stats s;
    stats_fn(&s);
    const char *expect = getenv("API_EXPECT_ALL_SAMPLED");
    if (expect && *expect == '1') {
        void *p = malloc(100);
        CHECK(aligned(p, (size_t)page));
        free(p);
        stats_fn(&s);
        CHECK(s.sampled > 50000);
        CHECK(s.unplaced == 0 || s.unplaced < s.sampled / 100);
    }
    printf("api ok: sampled=%lu unplaced=%lu freed=%lu live_pages=%lu\n",
           (unsigned long)s.sampled, (unsigned long)s.unplaced, (unsigned long)s.freed,
           (unsigned long)s.live_pages);
    return 0;
}
