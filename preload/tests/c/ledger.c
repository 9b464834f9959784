/* ledger: holds sampled blocks for a reader of its ledger outside the
 * process (run with ALLOCPROF_RATE=1: every allocation is sampled). With
 * LEDGER_PAUSE_US set, it sleeps that long after each allocation (the
 * unwinder's budget then lets every stack be unwound); LEDGER_BLOCKS sets
 * how many blocks it holds (16 by default, at most MAX_BLOCKS). Prints
 * "site <site_b's address>", one "block <ptr>" per block, then "ready";
 * on a line "free" frees the first half and prints "freed"; exits at EOF.
 * Built with and without frame pointers: site_b keeps enough values live
 * across its malloc calls that gcc -O2 -fomit-frame-pointer gives one of
 * them %rbp, so a frame-pointer walk breaks there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#define MAX_BLOCKS 100000
static void *blocks[MAX_BLOCKS];
static int N = 16;
static unsigned pause_us;

__attribute__((noinline)) long site_b(void **out, int n, long seed) {
    long a = seed, b = seed * 3, c = seed * 5, d = seed * 7, e = seed * 11, f = seed * 13;
    for (int i = 0; i < n; i++) {
        out[i] = malloc(100 + (a & 63));
        if (pause_us) usleep(pause_us);
        a = a * 31 + b;
        b ^= c;
        c += d;
        d ^= e;
        e += f;
        f ^= a;
    }
    return a + b + c + d + e + f;
}

int main(void) {
    const char *pause = getenv("LEDGER_PAUSE_US");
    if (pause) pause_us = (unsigned)atoi(pause);
    const char *count = getenv("LEDGER_BLOCKS");
    if (count) N = atoi(count);
    if (N < 1 || N > MAX_BLOCKS) return 2;
    long r = site_b(blocks, N, 0x1235);
    printf("site %p\n", (void *)site_b);
    for (int i = 0; i < N; i++) printf("block %p\n", blocks[i]);
    printf("ready %ld\n", r & 1);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "free", 4) == 0) {
            for (int i = 0; i < N / 2; i++) {
                free(blocks[i]);
                blocks[i] = NULL;
            }
            printf("freed\n");
            fflush(stdout);
        }
    }
    return 0;
}
