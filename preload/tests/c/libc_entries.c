/* glibc's own entry points (__libc_malloc & co.) mixed with the standard
 * names, in every pairing: a block from one family is resized and freed by
 * the other. Under LD_PRELOAD both families must be the library's (glibc's
 * __libc_* must not be reached with the library's blocks, nor the library's
 * free with glibc's). Sizes from 1 byte to 3 MiB, so at the default rate
 * some blocks are sampled and at ALLOCPROF_RATE=1 all are.
 * Prints "libc entries ok sampled=N"; exit status 0 = every check passed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#include "check.h"

struct stats { uint64_t sampled, unplaced, freed, live_pages; };

static void fill(void *p, size_t n, int v) { memset(p, v, n); }
static void expect(const void *p, size_t n, int v) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i += 1 + i / 8) CHECK(c[i] == (unsigned char)v);
    if (n) CHECK(c[n - 1] == (unsigned char)v);
}
static void expect_zero(const void *p, size_t n) { expect(p, n, 0); }

/* The object that defines `name` in the global scope. */
static const char *owner(const char *name) {
    Dl_info info;
    void *f = dlsym(RTLD_DEFAULT, name);
    CHECK(f != NULL);
    CHECK(dladdr(f, &info) != 0);
    return info.dli_fname;
}

static void pairs(size_t n) {
    /* __libc_malloc -> free; malloc -> __libc_free */
    char *a = __libc_malloc(n);
    CHECK(a != NULL);
    fill(a, n, 0x11);
    expect(a, n, 0x11);
    free(a);
    char *b = malloc(n);
    CHECK(b != NULL);
    fill(b, n, 0x22);
    __libc_free(b);

    /* calloc families, both ways */
    char *c = __libc_calloc(1, n);
    CHECK(c != NULL);
    expect_zero(c, n);
    free(c);
    char *d = calloc(n, 1);
    CHECK(d != NULL);
    expect_zero(d, n);
    __libc_free(d);

    /* realloc across families: grow and shrink, contents kept */
    char *e = malloc(n);
    CHECK(e != NULL);
    fill(e, n, 0x33);
    e = __libc_realloc(e, 2 * n);
    CHECK(e != NULL);
    expect(e, n, 0x33);
    e = realloc(e, n / 2 + 1);
    CHECK(e != NULL);
    expect(e, n / 2 + 1, 0x33);
    __libc_free(e);
    char *f = __libc_malloc(n);
    CHECK(f != NULL);
    fill(f, n, 0x44);
    f = realloc(f, 2 * n);
    CHECK(f != NULL);
    expect(f, n, 0x44);
    f = __libc_realloc(f, n / 2 + 1);
    CHECK(f != NULL);
    expect(f, n / 2 + 1, 0x44);
    free(f);

    /* aligned families */
    for (size_t align = 16; align <= 8192; align *= 8) {
        char *g = __libc_memalign(align, n);
        CHECK(g != NULL && (uintptr_t)g % align == 0);
        fill(g, n, 0x55);
        free(g);
        char *h = memalign(align, n);
        CHECK(h != NULL && (uintptr_t)h % align == 0);
        fill(h, n, 0x66);
        __libc_free(h);
    }
    long page = sysconf(_SC_PAGESIZE);
    char *v = __libc_valloc(n);
    CHECK(v != NULL && (uintptr_t)v % page == 0);
    fill(v, n, 0x77);
    free(v);
    char *w = valloc(n);
    CHECK(w != NULL && (uintptr_t)w % page == 0);
    __libc_free(w);
    char *pv = __libc_pvalloc(n);
    CHECK(pv != NULL && (uintptr_t)pv % page == 0);
    fill(pv, (n + page - 1) / page * page, 0x78);
    free(pv);
}

int main(void) {
    const size_t sizes[] = {1, 24, 100, 1000, 5000, 70000, 300000, 3 << 20};
    for (int round = 0; round < 10; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) pairs(sizes[i]);
    const char *lib = getenv("LD_PRELOAD");
    if (lib && *lib) {
        /* Both families come from the preloaded library. */
        const char *names[] = {"__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
                               "__libc_memalign", "__libc_valloc", "__libc_pvalloc"};
        const char *std_owner = owner("malloc");
        CHECK(strstr(std_owner, "liballocprof") != NULL);
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcmp(owner(names[i]), std_owner) != 0) {
                fprintf(stderr, "%s comes from %s, malloc from %s\n", names[i], owner(names[i]),
                        std_owner);
                exit(1);
            }
        }
    }
    struct stats s = {0};
    void (*stats_fn)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (stats_fn) stats_fn(&s);
    printf("libc entries ok sampled=%lu freed=%lu\n", (unsigned long)s.sampled,
           (unsigned long)s.freed);
    return 0;
}
