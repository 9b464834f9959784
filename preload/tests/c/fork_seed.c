/* fork_seed ROUNDS CHILDREN: per round, forks CHILDREN children from one
 * sampler state; each allocates 64-byte blocks until one is sampled
 * (allocprof_stats' count goes up) and reports K, that block's index.
 * Then the parent runs the same loop from the same state and prints
 * "round P K1 K2 ...", P its own index.
 * A child that runs out its parent's countdown samples nothing before the
 * parent does (P), at the earliest at P; a child that draws its own gap at
 * fork samples before P about half the time.
 * Exits 0 once every child has reported. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")
#define LIMIT 100000000L

struct stats { uint64_t sampled, unplaced, freed, live_pages; };
static void (*stats_fn)(struct stats *);

/* Index of the first sampled one of a run of 64-byte blocks. */
static long first_sample(void) {
    struct stats s;
    stats_fn(&s);
    uint64_t before = s.sampled;
    for (long k = 0; k < LIMIT; k++) {
        void *p = malloc(64);
        ESCAPE(p);
        free(p);
        stats_fn(&s);
        if (s.sampled != before) return k;
    }
    return -1;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    int n = argc > 2 ? atoi(argv[2]) : 8;
    stats_fn = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (!stats_fn) {
        fprintf(stderr, "allocprof_stats not found: not preloaded\n");
        return 2;
    }
    int results[2];
    if (pipe(results)) return 2;
    /* The first slow path seeds the sampler: make sure it has run. */
    for (int i = 0; i < 4; i++) {
        void *p = malloc(2 << 20);
        ESCAPE(p);
        free(p);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("seeded\n");
    for (int r = 0; r < rounds; r++) {
        /* Forks, waits and reads only: the parent allocates nothing
         * between its forks and its own run. */
        for (int c = 0; c < n; c++) {
            pid_t pid = fork();
            if (pid < 0) return 3;
            if (pid == 0) {
                long k = first_sample();
                _exit(k >= 0 && write(results[1], &k, sizeof k) == sizeof k ? 0 : 4);
            }
            int status;
            if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
                return 5;
        }
        long own = first_sample();
        if (own < 0) return 6;
        printf("round %ld", own);
        for (int c = 0; c < n; c++) {
            long k;
            if (read(results[0], &k, sizeof k) != sizeof k) return 7;
            printf(" %ld", k);
        }
        printf("\n");
    }
    return 0;
}
