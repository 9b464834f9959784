/* The sample region under real programs, one mode per run (argv[1]):
 *   churn MIB N     N x (malloc MIB MiB, memset, free): minor faults per
 *                   iteration (getrusage) after a warm-up, and how often
 *                   the block was not where the last one was
 *   bound           16 x 16 MiB live and written, then all freed: what
 *                   stays resident (the warm big slots' bound)
 *   core            a live 32 MiB block filled with a pattern, then abort()
 *                   (or, with argv[2] = "wait", wait for stdin to close)
 *   fork-init       forks from two threads while the main thread makes the
 *                   process's first sampled allocation; every child (and
 *                   grandchild) must sample
 *   cancel          a thread with a pending deferred cancel makes the first
 *                   sampled allocation; malloc must return
 *   commit          64 MiB held in 64 KiB blocks, then "ready", then waits
 *                   for stdin to close (the test reads our smaps)
 *   calloc-usable   calloc from a warm slot: all malloc_usable_size bytes
 *                   read as zero
 *   unsampled [wait]  unsampled 2 MiB blocks take the warm slot a sampled
 *                   one left, through every entry point (see below)
 *   unsampled-double-free  one of them freed twice
 * Prints result lines; exit status 0 = its own checks passed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

struct stats { uint64_t sampled, unplaced, freed, live_pages; };

static struct stats get_stats(void) {
    struct stats s = {0};
    void (*f)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (f) f(&s);
    return s;
}

static long minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static long rss_kib(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f != NULL);
    CHECK(fscanf(f, "%ld %ld", &pages, &rss) == 2);
    fclose(f);
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int churn(size_t mib, long n) {
    size_t size = mib << 20;
    /* Warm-up: first faults of whatever is reused, until one block was
     * sampled (so the region has a slot of this size), or 64 rounds. */
    struct stats w = get_stats();
    for (int i = 0; i < 3 || (get_stats().sampled == w.sampled && i < 64); i++) {
        char *p = malloc(size);
        CHECK(p != NULL);
        memset(p, i + 1, size);
        free(p);
    }
    struct stats s0 = get_stats();
    long f0 = minflt();
    double t0 = now();
    /* Switches: iterations whose block is not where the last one was (the
     * loop then writes two buffers in turn). */
    long switches = 0;
    char *last = NULL;
    for (long i = 0; i < n; i++) {
        char *p = malloc(size);
        CHECK(p != NULL);
        memset(p, (int)i, size);
        switches += last != NULL && p != last;
        last = p;
        free(p);
    }
    double t = now() - t0;
    long f = minflt() - f0;
    struct stats s1 = get_stats();
    printf("churn mib=%zu faults_per_iter=%ld pages=%zu sampled=%lu switches=%ld ms=%.1f\n", mib,
           f / n, size / 4096, (unsigned long)(s1.sampled - s0.sampled), switches, t * 1e3);
    return 0;
}

static int bound(void) {
    enum { N = 16 };
    static char *b[N];
    long r0 = rss_kib();
    for (int i = 0; i < N; i++) {
        CHECK((b[i] = malloc(16 << 20)) != NULL);
        memset(b[i], 1, 16 << 20);
    }
    long r1 = rss_kib();
    for (int i = 0; i < N; i++) free(b[i]);
    long r2 = rss_kib();
    struct stats s = get_stats();
    printf("bound held_kib=%ld after_free_kib=%ld sampled=%lu\n", r1 - r0, r2 - r0,
           (unsigned long)s.sampled);
    return 0;
}

/* A 32-byte line repeated over the block: easy to find in a core. */
static void fill_pattern(char *p, size_t n) {
    static const char line[33] = "allocprof-core-dump-pattern-0123";
    for (size_t i = 0; i + 32 <= n; i += 32) memcpy(p + i, line, 32);
}

static int core(const char *how) {
    size_t size = 32 << 20;
    char *p = malloc(size);
    CHECK(p != NULL);
    fill_pattern(p, size);
    struct stats s = get_stats();
    printf("core block=%p sampled=%lu unplaced=%lu live_pages=%lu\n", (void *)p,
           (unsigned long)s.sampled, (unsigned long)s.unplaced, (unsigned long)s.live_pages);
    fflush(stdout);
    if (how && !strcmp(how, "wait")) {
        char c;
        while (read(0, &c, 1) > 0) {}
        free(p);
        return 0;
    }
    abort();
}

/* --- fork-init -------------------------------------------------------- */

static atomic_int stop, forking;
static double t_start, t_end;

/* In a fork child: sample once, and have a child of its own do so too. */
static int child_samples(int depth) {
    struct stats s0 = get_stats();
    void *p = malloc(1u << 30); /* sampled (R = 64m): untouched, address space only */
    if (!p) return 10;
    struct stats s1 = get_stats();
    int bad = s1.sampled == s0.sampled || s1.unplaced != s0.unplaced;
    free(p);
    if (depth == 0) {
        pid_t g = fork();
        if (g == 0) _exit(child_samples(1));
        int st = 0;
        if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad |= 2;
    }
    return bad;
}

enum { MAX_CHILDREN = 300 };
struct forker { long children, bad, in_window; pid_t pid[MAX_CHILDREN]; double t[MAX_CHILDREN]; };

/* Forks as fast as it can (children are reaped afterwards), so that some
 * forks land while the main thread is creating the region. */
static void *forker(void *arg) {
    struct forker *f = arg;
    atomic_fetch_add(&forking, 1);
    while (!atomic_load(&stop) && f->children < MAX_CHILDREN) {
        double t = now();
        pid_t c = fork();
        if (c == 0) _exit(child_samples(0));
        CHECK(c > 0);
        f->pid[f->children] = c;
        f->t[f->children++] = t;
    }
    for (long i = 0; i < f->children; i++) {
        int st = 0;
        CHECK(waitpid(f->pid[i], &st, 0) == f->pid[i]);
        f->bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        f->in_window += f->t[i] >= t_start && f->t[i] <= t_end;
    }
    return NULL;
}

static int fork_init(void) {
    struct stats s = get_stats();
    if (s.sampled != 0) {
        printf("fork-init early-sample sampled=%lu\n", (unsigned long)s.sampled);
        return 3;
    }
    pthread_t th[2];
    struct forker f[2] = {{0}};
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, forker, &f[i]) == 0);
    while (atomic_load(&forking) < 2) {}
    struct timespec d = {0, 200000};
    nanosleep(&d, NULL);
    t_start = now();
    void *p = malloc(1u << 30); /* the process's first sampled allocation */
    t_end = now();
    CHECK(p != NULL);
    struct timespec d2 = {0, 2000000};
    nanosleep(&d2, NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    s = get_stats();
    printf("fork-init children=%ld bad=%ld in_window=%ld parent_unplaced=%lu\n",
           f[0].children + f[1].children, f[0].bad + f[1].bad,
           f[0].in_window + f[1].in_window, (unsigned long)s.unplaced);
    free(p);
    return 0;
}

/* --- cancel ----------------------------------------------------------- */

static atomic_int returned;
static struct stats cancel_stats;

static void *cancelled_thread(void *arg) {
    (void)arg;
    /* Deferred (the default): the cancel stays pending until the next
     * cancellation point. malloc must not be one. */
    CHECK(pthread_cancel(pthread_self()) == 0);
    void *p = malloc(128 << 20); /* the process's first sampled allocation (R = 8m) */
    atomic_store(&returned, 1);
    cancel_stats = get_stats();
    free(p);
    pthread_testcancel();
    return NULL;
}

static int cancel(void) {
    struct stats s = get_stats();
    if (s.sampled != 0) {
        printf("cancel early-sample sampled=%lu\n", (unsigned long)s.sampled);
        return 3;
    }
    pthread_t th;
    CHECK(pthread_create(&th, NULL, cancelled_thread, NULL) == 0);
    void *res = NULL;
    CHECK(pthread_join(th, &res) == 0);
    int was_cancelled = res == PTHREAD_CANCELED;
    for (int i = 0; i < 100; i++) { /* each sampled but 1 in 3,000 (64 MiB at R = 8m) */
        void *p = malloc(64 << 20);
        CHECK(p != NULL);
        free(p);
    }
    s = get_stats();
    printf("cancel returned=%d cancelled=%d first_sampled=%lu first_unplaced=%lu sampled=%lu "
           "unplaced=%lu\n",
           atomic_load(&returned), was_cancelled, (unsigned long)cancel_stats.sampled,
           (unsigned long)cancel_stats.unplaced, (unsigned long)s.sampled,
           (unsigned long)s.unplaced);
    return 0;
}

/* --- commit ----------------------------------------------------------- */

static int commit(void) {
    enum { N = 1024 };
    static char *b[N];
    for (int i = 0; i < N; i++) {
        CHECK((b[i] = malloc(64 << 10)) != NULL);
        memset(b[i], 1, 64 << 10);
    }
    struct stats s = get_stats();
    printf("ready sampled=%lu unplaced=%lu live_pages=%lu\n", (unsigned long)s.sampled,
           (unsigned long)s.unplaced, (unsigned long)s.live_pages);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    for (int i = 0; i < N; i++) free(b[i]);
    return 0;
}

/* --- calloc-usable ---------------------------------------------------- */

static int calloc_usable(void) {
    const size_t sizes[] = {100, 5000, 70000, (1 << 20) + 100, (3 << 20) + 100};
    int reused = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        size_t u = malloc_usable_size(p);
        memset(p, 0xa5, u);
        free(p);
        unsigned char *q = calloc(1, n);
        CHECK(q != NULL);
        reused += q == p;
        size_t uq = malloc_usable_size(q);
        CHECK(uq >= n);
        for (size_t j = 0; j < uq; j++) {
            if (q[j] != 0) {
                printf("calloc-usable size=%zu usable=%zu nonzero_at=%zu\n", n, uq, j);
                return 1;
            }
        }
        free(q);
    }
    struct stats s = get_stats();
    printf("calloc-usable ok reused=%d sampled=%lu\n", reused, (unsigned long)s.sampled);
    return 0;
}

/* --- unsampled --------------------------------------------------------- */

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

enum { BIG = 2 << 20 };
static char *slot;                 /* the warm 2 MiB slot of the region */
static unsigned long sampled_big;  /* 2 MiB blocks sampled (all at `slot`) */
static unsigned long unsampled;    /* unsampled blocks checked at `slot` */

static unsigned long sampled_count(void) { return get_stats().sampled; }

static void expect_bytes(const unsigned char *p, size_t n, int v) {
    for (size_t i = 0; i < n; i++) CHECK(p[i] == (unsigned char)v);
}

/* Releases a block of `slot` by `how` (0 = free, 1 = __libc_free). */
static void release(void *p, int how) {
    if (how) __libc_free(p);
    else free(p);
}

/* Runs `alloc` until it returns an unsampled block (61% of 2 MiB blocks
 * at ALLOCPROF_RATE=4m), which must be at `slot`, as every sampled one
 * is (freed at once). */
#define UNSAMPLED(var, alloc)                                          \
    for (int tries_ = 0;; tries_++) {                                  \
        CHECK(tries_ < 200);                                           \
        unsigned long s0_ = sampled_count();                           \
        var = (alloc);                                                 \
        CHECK(var != NULL);                                            \
        CHECK((char *)var == slot);                                    \
        if (sampled_count() == s0_) break;                             \
        sampled_big++;                                                 \
        free(var);                                                     \
    }                                                                  \
    unsampled++

/* At ALLOCPROF_RATE=4m: a sampled 2 MiB block, freed, leaves a warm slot;
 * every later 2 MiB block, unsampled ones included, takes it, through
 * every entry point, and behaves as a heap block (usable size, calloc's
 * zeroes, realloc in and out, free by either family). With argv "wait":
 * then holds one unsampled block at the slot ("held"), prints "ready" and
 * waits for stdin to close (the test reads the ledger meanwhile). */
static int unsampled_blocks(const char *how) {
    printf("unsampled start\n"); /* stdout's buffer: allocated before the counts */
    fflush(stdout);
    for (int i = 0; i < 1000 && !slot; i++) {
        unsigned long s0 = sampled_count();
        char *p = malloc(BIG);
        CHECK(p != NULL);
        memset(p, 0x5a, BIG);
        if (sampled_count() != s0) {
            slot = p;
            sampled_big++;
        }
        free(p);
    }
    CHECK(slot != NULL);
    unsigned char *q;
    for (int how = 0; how < 2; how++) {
        UNSAMPLED(q, how ? __libc_malloc(BIG) : malloc(BIG));
        CHECK(malloc_usable_size(q) >= BIG);
        memset(q, 0x21, malloc_usable_size(q));
        release(q, !how); /* the other family frees it */
        UNSAMPLED(q, how ? __libc_calloc(1, BIG) : calloc(1, BIG));
        expect_bytes(q, malloc_usable_size(q), 0);
        memset(q, 0x22, BIG);
        release(q, how);
    }
    void *a;
    UNSAMPLED(a, posix_memalign(&a, 1 << 16, BIG) == 0 ? a : NULL);
    CHECK((uintptr_t)a % (1 << 16) == 0);
    free(a);
    UNSAMPLED(a, aligned_alloc(1 << 12, BIG));
    free(a);
    /* realloc out of the region: growing, shrinking, shrinking to a big
     * block (sizes of other classes, so that the slot stays the only one
     * of its class: a sampled move within the class would make another). */
    size_t sizes[] = {BIG + BIG / 2, 100, BIG / 2};
    for (int i = 0; i < 3; i++) {
        UNSAMPLED(q, malloc(BIG));
        memset(q, 0x30 + i, BIG);
        size_t keep = sizes[i] < BIG ? sizes[i] : BIG;
        unsigned char *r = i == 1 ? __libc_realloc(q, sizes[i]) : realloc(q, sizes[i]);
        CHECK(r != NULL);
        expect_bytes(r, keep, 0x30 + i);
        free(r);
    }
    /* A backend block grown to 2 MiB: sampled, it moves to the slot;
     * unsampled, the backend resizes it (in place if it can). */
    for (int i = 0; i < 20; i++) {
        unsigned char *small = malloc(1000);
        CHECK(small != NULL);
        memset(small, 0x41, 1000);
        unsigned char *r = realloc(small, BIG);
        CHECK(r != NULL);
        expect_bytes(r, 1000, 0x41);
        free(r);
    }
    if (how && !strcmp(how, "wait")) {
        UNSAMPLED(q, malloc(BIG));
        memset(q, 0x55, BIG);
        printf("held 0x%lx\nready\n", (unsigned long)(uintptr_t)q);
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {}
        free(q);
    }
    struct stats st = get_stats();
    printf("unsampled ok slot=%lu sampled_big=%lu unsampled=%lu sampled=%lu freed=%lu "
           "unplaced=%lu\n",
           (unsigned long)(uintptr_t)slot, sampled_big, unsampled, (unsigned long)st.sampled,
           (unsigned long)st.freed, (unsigned long)st.unplaced);
    return 0;
}

/* An unsampled block of the region freed twice: caught, as a sampled one. */
static int unsampled_double_free(void) {
    CHECK(unsampled_blocks(NULL) == 0);
    unsigned char *q;
    UNSAMPLED(q, malloc(BIG));
    free(q);
    printf("freeing 0x%lx again\n", (unsigned long)(uintptr_t)q);
    fflush(stdout);
    free(q);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "churn") && argc > 3) return churn((size_t)atol(argv[2]), atol(argv[3]));
    if (!strcmp(mode, "bound")) return bound();
    if (!strcmp(mode, "core")) return core(argc > 2 ? argv[2] : NULL);
    if (!strcmp(mode, "fork-init")) return fork_init();
    if (!strcmp(mode, "cancel")) return cancel();
    if (!strcmp(mode, "commit")) return commit();
    if (!strcmp(mode, "calloc-usable")) return calloc_usable();
    if (!strcmp(mode, "unsampled")) return unsampled_blocks(argc > 2 ? argv[2] : NULL);
    if (!strcmp(mode, "unsampled-double-free")) return unsampled_double_free();
    fprintf(stderr, "unknown mode '%s'\n", mode);
    return 2;
}
