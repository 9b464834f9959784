/* An emitter (contrib/allocprof_probes.h) whose huge samples meet heavy
 * back-pressure: a flood of light samples (64 B, weight R, each freed at
 * once) raises its thin factor to thousands, then HEAVY samples of 4 GiB
 * blocks (weight 4 GiB, a multiple of R: the `nsamples × R` form) stay
 * live. No memory is allocated: only the probes fire, with made-up
 * addresses.
 *   heavy_thinned LIGHT HEAVY
 * It prints "ready", fires on the line "go", prints "done", and exits at
 * end of input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define ALLOCPROF_PROBES_IMPLEMENTATION
#include "allocprof_probes.h"

#define R 65536ull
#define HEAVY_SIZE (4ull << 30)

static uint64_t next_ptr = 0x10000000;

__attribute__((noinline)) static void site_light(uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        void *p = (void *)(next_ptr += 16);
        allocprof_probe_alloc(p, 64, R);
        allocprof_probe_free(p);
    }
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void site_heavy(uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        allocprof_probe_alloc((void *)(next_ptr += 16), HEAVY_SIZE, HEAVY_SIZE);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 64;
    uint64_t light = strtoull(argv[1], NULL, 10);
    uint64_t heavy = strtoull(argv[2], NULL, 10);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 0;
    /* Light first: the smallest weight is R from the first samples (see
     * profiler_common::weight_check), and the factor is up before the
     * heavy ones fire. */
    site_light(light);
    site_heavy(heavy);
    printf("done\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
