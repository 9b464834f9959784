/* An emitter of the heap-sampling probes with its own per-byte sampler, as a
 * third-party allocator would have: no real allocation, only the probes.
 *   weighted_sites FORM PROVIDER SEED
 * FORM: `points` (weight = nsamples × R, OpenTelemetry's form), `inverse`
 * (weight = size / p), or `nonsense` (weights 0, UINT64_MAX and below size).
 * PROVIDER: `otel`, `ddheap`, or `both` (ddheap for site_medium only).
 * Built with -DUSE_KIT it fires through contrib/allocprof_probes.h (its
 * provider fixed at build time) instead of <sys/sdt.h>.
 * It prints "ready", runs the sites on the line "go", prints "done", and
 * exits at end of input. The sites (sizes, counts) are SITES in
 * tests/weights.rs; R is RATE there. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define R 65536.0

#ifdef USE_KIT
#define ALLOCPROF_PROBES_IMPLEMENTATION
#include "allocprof_probes.h"
static void fire_alloc(int ddheap, uint64_t ptr, uint64_t size, uint64_t weight) {
    (void)ddheap;
    allocprof_probe_alloc((void *)ptr, size, weight);
}
static void fire_free(int ddheap, uint64_t ptr) {
    (void)ddheap;
    allocprof_probe_free((void *)ptr);
}
#else
/* Register operands only: the notes then say `8@%rdi`-style arguments. */
#define STAP_SDT_ARG_CONSTRAINT r
#include <sys/sdt.h>
__attribute__((noinline)) static void fire_alloc(int ddheap, uint64_t ptr, uint64_t size,
                                                 uint64_t weight) {
    if (ddheap)
        DTRACE_PROBE3(ddheap, alloc, ptr, size, weight);
    else
        DTRACE_PROBE3(otel_memory, alloc, ptr, size, weight);
    __asm__ volatile("" ::: "memory");
}
__attribute__((noinline)) static void fire_free(int ddheap, uint64_t ptr) {
    if (ddheap)
        DTRACE_PROBE1(ddheap, free, ptr);
    else
        DTRACE_PROBE1(otel_memory, free, ptr);
    __asm__ volatile("" ::: "memory");
}
#endif

enum form { POINTS, INVERSE, NONSENSE };
static enum form form;
static int provider; /* 0 otel, 1 ddheap, 2 both */
static uint64_t rng, next_ptr = 0x10000000;
static double countdown; /* bytes to the next sampling point */

static uint64_t splitmix(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double exp_gap(void) {
    double u = ((splitmix() >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
    return -log(u) * R;
}

/* The sampling points the block's bytes cross (a Poisson process of mean
 * gap R over the byte stream). */
static uint64_t points_crossed(uint64_t size) {
    double s = (double)size;
    uint64_t n = 0;
    while (countdown <= s) {
        s -= countdown;
        countdown = exp_gap();
        n++;
    }
    countdown -= s;
    return n;
}

/* Returns the pointer reported (0: not sampled). */
static uint64_t allocate(int ddheap, uint64_t size) {
    uint64_t ptr = next_ptr;
    next_ptr += 16;
    uint64_t n = points_crossed(size);
    if (n == 0)
        return 0;
    uint64_t weight;
    if (form == INVERSE)
        weight = (uint64_t)llround((double)size / -expm1(-(double)size / R));
    else
        weight = n * (uint64_t)R;
    fire_alloc(ddheap, ptr, size, weight);
    return ptr;
}

__attribute__((noinline)) static void site_small(void) {
    for (int i = 0; i < 20000; i++)
        allocate(provider == 1, 64);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void site_medium(void) {
    for (int i = 0; i < 2000; i++)
        allocate(provider != 0, 3000);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void site_large(void) {
    for (int i = 0; i < 40; i++)
        allocate(provider == 1, 200000);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void site_freed(void) {
    for (int i = 0; i < 10000; i++) {
        uint64_t p = allocate(provider == 1, 512);
        if (p)
            fire_free(provider == 1, p);
    }
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void site_nonsense(void) {
    int dd = provider == 1;
    fire_alloc(dd, next_ptr += 16, 1000, 0);
    fire_alloc(dd, next_ptr += 16, 1000, UINT64_MAX);
    fire_alloc(dd, next_ptr += 16, 5000, 4097);
    fire_alloc(dd, next_ptr += 16, 100, 65636);
    fire_alloc(dd, next_ptr += 16, UINT64_MAX, UINT64_MAX);
    fire_alloc(dd, next_ptr += 16, 0, 12345);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 64;
    form = !strcmp(argv[1], "points") ? POINTS : !strcmp(argv[1], "inverse") ? INVERSE : NONSENSE;
    provider = !strcmp(argv[2], "otel") ? 0 : !strcmp(argv[2], "ddheap") ? 1 : 2;
    rng = strtoull(argv[3], NULL, 10);
    countdown = exp_gap();
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 0;
    /* Small blocks first: a `points` process's smallest weight is then R
     * from its first samples (see profiler_common::weight_check). */
    site_small();
    site_medium();
    site_large();
    site_freed();
    if (form == NONSENSE)
        site_nonsense();
    printf("done\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
