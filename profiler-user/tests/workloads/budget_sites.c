/* Back-pressure: a sustained stream of sampled allocations at two sites of
 * known truth. Waits for a line; then for SECONDS (argv[1]) seconds churns
 * 256-byte blocks (malloc + free) at churn_site and, every 64th iteration,
 * keeps one 512-byte block live at keep_site (at most N_KEEP). argv[2] and
 * argv[3], if given, are the churned and the kept block sizes. Prints
 * "ready CHURNED KEPT SECONDS", waits for a line, exits. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N_KEEP 20000

static void *kept[N_KEEP];

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t churn_size = 256, keep_size = 512;

__attribute__((noinline)) void churn_site(void) {
    void *p = malloc(churn_size);
    ESCAPE(p);
    free(p);
}

__attribute__((noinline)) void *keep_site(void) {
    void *p = malloc(keep_size);
    ESCAPE(p);
    return p;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    if (argc > 3) {
        churn_size = strtoul(argv[2], NULL, 10);
        keep_size = strtoul(argv[3], NULL, 10);
    }
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    long churned = 0, n_kept = 0;
    double t0 = now(), t = t0;
    while (t - t0 < seconds) {
        for (int i = 0; i < 64; i++) churn_site();
        churned += 64;
        if (n_kept < N_KEEP) kept[n_kept++] = keep_site();
        t = now();
    }
    printf("ready %ld %ld %.3f\n", churned, n_kept, t - t0);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
