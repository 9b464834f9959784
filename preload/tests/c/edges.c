/* Edge cases of the sample region, one per mode (argv[1]); run under
 * LD_PRELOAD with ALLOCPROF_RATE=1 unless a mode says otherwise.
 *   double-free  free a sampled block twice (must abort in the second free)
 *   errno        successful allocation calls never change errno
 *   free-sized   C23 free_sized / free_aligned_sized, looked up at run time
 *   region       where a sampled block lives: its mapping's size and VmFlags
 *   huge         4 x 256 MiB + 1 GiB + 1,500 x 3 MiB live at once, untouched
 *   unplaced     a sample aligned beyond what the region offers
 * Prints one result line per mode; exit status 0 = its own checks passed. */
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

static struct stats get_stats(void) {
    struct stats s = {0};
    void (*f)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    CHECK(f != NULL);
    f(&s);
    return s;
}

static void print_stats(const char *what) {
    struct stats s = get_stats();
    printf("%s sampled=%lu unplaced=%lu freed=%lu live_pages=%lu\n", what,
           (unsigned long)s.sampled, (unsigned long)s.unplaced, (unsigned long)s.freed,
           (unsigned long)s.live_pages);
}

static int double_free(void) {
    char *p = malloc(100);
    CHECK(p != NULL);
    printf("block %p\n", (void *)p);
    fflush(stdout);
    free(p);
    free(p); /* must not return */
    char *a = malloc(100), *b = malloc(100);
    printf("survived double free%s\n", a == b ? ": aliased pointers" : "");
    return 0;
}

static const int SENTINEL = 4321;
#define KEEP(call)                                                              \
    do {                                                                        \
        errno = SENTINEL;                                                       \
        void *r_ = (call);                                                      \
        CHECK(r_ != NULL);                                                      \
        if (errno != SENTINEL) {                                                \
            fprintf(stderr, "%s changed errno to %d (%s)\n", #call, errno,      \
                    strerror(errno));                                           \
            exit(1);                                                            \
        }                                                                       \
        live[n++ % 64] = r_;                                                    \
    } while (0)

static int errno_kept(void) {
    static void *live[64];
    size_t n = 0;
    const size_t sizes[] = {1, 100, 4096, 5000, 70000, 1 << 20, 3 << 20, 40 << 20};
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t s = sizes[i];
            if (live[n % 64]) { free(live[n % 64]); live[n % 64] = NULL; }
            KEEP(malloc(s));
            if (live[n % 64]) { free(live[n % 64]); live[n % 64] = NULL; }
            KEEP(calloc(1, s));
            if (live[n % 64]) { free(live[n % 64]); live[n % 64] = NULL; }
            KEEP(aligned_alloc(1 << 16, s));
            if (live[n % 64]) { free(live[n % 64]); live[n % 64] = NULL; }
            KEEP(memalign(64, s));
            if (live[n % 64]) { free(live[n % 64]); live[n % 64] = NULL; }
            KEEP(valloc(s));
            void *r = malloc(s / 2 + 1);
            CHECK(r != NULL);
            if (live[n % 64]) { free(live[n % 64]); live[n % 64] = NULL; }
            KEEP(realloc(r, s * 2));
            void *pm = NULL;
            errno = SENTINEL;
            CHECK(posix_memalign(&pm, 4096, s) == 0 && errno == SENTINEL);
            free(pm);
        }
    }
    for (int i = 0; i < 64; i++) free(live[i]);
    print_stats("errno ok:");
    return 0;
}

static int free_sized_works(void) {
    void (*fs)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void (*fas)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    CHECK(fs != NULL && fas != NULL);
    struct stats before = get_stats();
    for (int i = 0; i < 100; i++) {
        char *p = malloc(100 + (size_t)i);
        char *q = aligned_alloc(256, 512);
        CHECK(p && q);
        memset(p, 1, 100);
        memset(q, 2, 512);
        fs(p, 100 + (size_t)i);
        fas(q, 256, 512);
    }
    fs(NULL, 0);
    fas(NULL, 16, 0);
    struct stats after = get_stats();
    /* Everything sampled at rate 1: every block went back to the region. */
    CHECK(after.freed - before.freed == after.sampled - before.sampled);
    CHECK(after.live_pages == before.live_pages);
    print_stats("free_sized ok:");
    return 0;
}

/* The /proc/self/smaps entry holding p: prints its size and VmFlags. */
static int region(void) {
    char *big = malloc(100 << 20); /* untouched: address space only */
    char *small = malloc(100);
    CHECK(big && small);
    FILE *f = fopen("/proc/self/smaps", "r");
    CHECK(f != NULL);
    char line[512];
    int inside = 0;
    uintptr_t lo = 0, hi = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, ':') > line + 8) {
            inside = (uintptr_t)big >= a && (uintptr_t)big < b;
            if (inside) { lo = a; hi = b; }
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            printf("mapping_mib=%lu %s", (unsigned long)((hi - lo) >> 20), line);
        }
    }
    fclose(f);
    print_stats("region:");
    return 0;
}

static int huge(void) {
    static void *keep[2000];
    int n = 0;
    for (int i = 0; i < 4; i++) CHECK((keep[n++] = malloc(256u << 20)) != NULL);
    CHECK((keep[n++] = malloc(1u << 30)) != NULL);
    for (int i = 0; i < 1500; i++) CHECK((keep[n++] = malloc(3u << 20)) != NULL);
    print_stats("huge:");
    for (int i = 0; i < n; i++) free(keep[i]);
    return 0;
}

static int unplaced(void) {
    void *p = aligned_alloc(256u << 20, 4096);
    CHECK(p != NULL && ((uintptr_t)p & ((256u << 20) - 1)) == 0);
    print_stats("unplaced:");
    free(p);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "double-free")) return double_free();
    if (!strcmp(mode, "errno")) return errno_kept();
    if (!strcmp(mode, "free-sized")) return free_sized_works();
    if (!strcmp(mode, "region")) return region();
    if (!strcmp(mode, "huge")) return huge();
    if (!strcmp(mode, "unplaced")) return unplaced();
    fprintf(stderr, "unknown mode '%s'\n", mode);
    return 2;
}
