/* Concurrency stress under LD_PRELOAD:
 * `stress threads|fork|fork-reseed|signals|signals-async`.
 * Exit status 0 = pass. */
#define _GNU_SOURCE
#include <errno.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c)                                                            \
    do {                                                                    \
        if (!(c)) {                                                         \
            fprintf(stderr, "stress.c:%d: check failed: %s\n", __LINE__, #c); \
            _exit(1);                                                       \
        }                                                                   \
    } while (0)

static unsigned next_rand(unsigned *s) { *s = *s * 1103515245u + 12345u; return *s >> 8; }
static size_t rand_size(unsigned *s) {
    unsigned r = next_rand(s);
    if ((r & 63) == 0) return (r >> 6) % 300000 + 1; /* occasional large */
    return (r >> 6) % 512 + 1;
}
static void stamp(unsigned char *p, size_t n, unsigned char tag) {
    p[0] = tag;
    p[n - 1] = tag;
    if (n > 2) p[n / 2] = tag;
}
static int stamped(const unsigned char *p, size_t n, unsigned char tag) {
    return p[0] == tag && p[n - 1] == tag && (n <= 2 || p[n / 2] == tag);
}

/* ---- threads: producers allocate, consumers free (cross-thread). ---- */
enum { RING = 1024 };
struct ring {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void *ptr[RING];
    size_t len[RING];
    int head, tail, done;
};

static void ring_put(struct ring *r, void *p, size_t n) {
    pthread_mutex_lock(&r->mu);
    while ((r->head + 1) % RING == r->tail) pthread_cond_wait(&r->cv, &r->mu);
    r->ptr[r->head] = p;
    r->len[r->head] = n;
    r->head = (r->head + 1) % RING;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
static int ring_get(struct ring *r, void **p, size_t *n) {
    pthread_mutex_lock(&r->mu);
    while (r->head == r->tail && !r->done) pthread_cond_wait(&r->cv, &r->mu);
    if (r->head == r->tail) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    *p = r->ptr[r->tail];
    *n = r->len[r->tail];
    r->tail = (r->tail + 1) % RING;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 1;
}

static void *producer(void *arg) {
    struct ring *r = arg;
    unsigned s = (unsigned)(uintptr_t)pthread_self();
    for (int i = 0; i < 100000; i++) {
        size_t n = rand_size(&s);
        unsigned char *p = (i & 3) == 0 ? calloc(1, n) : malloc(n);
        CHECK(p != NULL);
        stamp(p, n, (unsigned char)n);
        if ((i & 7) == 0) {
            size_t m = rand_size(&s);
            p = realloc(p, m);
            CHECK(p != NULL);
            n = m;
            stamp(p, n, (unsigned char)n);
        }
        ring_put(r, p, n);
        void *local = malloc(rand_size(&s)); /* same-thread churn too */
        free(local);
    }
    return NULL;
}

static void *consumer(void *arg) {
    struct ring *r = arg;
    void *p;
    size_t n;
    while (ring_get(r, &p, &n)) {
        CHECK(stamped(p, n, (unsigned char)n));
        if (n & 1) { /* realloc a block allocated by another thread */
            p = realloc(p, n + 100);
            CHECK(p != NULL && stamped(p, 1, (unsigned char)n));
        }
        free(p);
    }
    return NULL;
}

static void *short_lived(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) free(malloc(1000 + i));
    return malloc(5000); /* freed by the joiner */
}

static int run_threads(void) {
    enum { PAIRS = 2 };
    struct ring rings[PAIRS];
    pthread_t prod[PAIRS], cons[PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        memset(&rings[i], 0, sizeof rings[i]);
        pthread_mutex_init(&rings[i].mu, NULL);
        pthread_cond_init(&rings[i].cv, NULL);
        CHECK(pthread_create(&prod[i], NULL, producer, &rings[i]) == 0);
        CHECK(pthread_create(&cons[i], NULL, consumer, &rings[i]) == 0);
    }
    /* Threads that exit while their blocks live on. */
    for (int i = 0; i < 200; i++) {
        pthread_t t;
        void *ret;
        CHECK(pthread_create(&t, NULL, short_lived, NULL) == 0);
        CHECK(pthread_join(t, &ret) == 0);
        free(ret);
    }
    for (int i = 0; i < PAIRS; i++) {
        pthread_join(prod[i], NULL);
        pthread_mutex_lock(&rings[i].mu);
        rings[i].done = 1;
        pthread_cond_broadcast(&rings[i].cv);
        pthread_mutex_unlock(&rings[i].mu);
        pthread_join(cons[i], NULL);
    }
    return 0;
}

/* ---- fork: fork repeatedly while other threads allocate. ---- */
static atomic_int stop_churn;

static void *churner(void *arg) {
    (void)arg;
    unsigned s = (unsigned)(uintptr_t)pthread_self();
    void *keep[64] = {0};
    while (!atomic_load(&stop_churn)) {
        int k = next_rand(&s) % 64;
        free(keep[k]);
        size_t n = rand_size(&s);
        keep[k] = malloc(n);
        CHECK(keep[k] != NULL);
        stamp(keep[k], n, 7);
    }
    for (int k = 0; k < 64; k++) free(keep[k]);
    return NULL;
}

static int run_fork(void) {
    pthread_t t[3];
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&t[i], NULL, churner, NULL) == 0);
    unsigned char *parent_block = malloc(1 << 20);
    memset(parent_block, 0x5a, 1 << 20);
    for (int i = 0; i < 50; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            /* The child may touch memory inherited from the parent. */
            for (int j = 0; j < (1 << 20); j += 4096) CHECK(parent_block[j] == 0x5a);
            parent_block = realloc(parent_block, 2 << 20);
            CHECK(parent_block != NULL && parent_block[0] == 0x5a);
            free(parent_block);
            unsigned s = (unsigned)getpid();
            void *keep[32] = {0};
            for (int j = 0; j < 20000; j++) {
                int k = next_rand(&s) % 32;
                free(keep[k]);
                keep[k] = malloc(rand_size(&s));
                CHECK(keep[k] != NULL);
            }
            pthread_t ct;
            CHECK(pthread_create(&ct, NULL, short_lived, NULL) == 0);
            void *ret;
            pthread_join(ct, &ret);
            free(ret);
            for (int k = 0; k < 32; k++) free(keep[k]);
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    atomic_store(&stop_churn, 1);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    CHECK(parent_block[12345] == 0x5a);
    free(parent_block);
    return 0;
}

/* ---- signals: handlers that allocate. ---- */
static atomic_int handled;

static void handler(int sig) {
    (void)sig;
    int saved = errno;
    void *a = malloc(100);
    void *b = calloc(1, 70000);
    CHECK(a != NULL && b != NULL);
    stamp(a, 100, 1);
    b = realloc(b, 200);
    CHECK(b != NULL);
    free(a);
    free(b);
    atomic_fetch_add(&handled, 1);
    errno = saved;
}

static atomic_int stop_kill;
static void *killer(void *arg) {
    pthread_t target = *(pthread_t *)arg;
    struct timespec ts = {0, 20000};
    while (!atomic_load(&stop_kill)) {
        pthread_kill(target, SIGUSR1);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* `async`: signals interrupt the thread at arbitrary points in malloc.
 * Only valid when everything is sampled (ALLOCPROF_RATE=1): then only
 * allocprof's lock-free code runs, never the backend, which (glibc or
 * mimalloc) is not async-signal-safe itself. */
static int run_signals(int async) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    if (!async) {
        for (int i = 0; i < 20000; i++) {
            void *p = malloc(i % 3000 + 1);
            raise(SIGUSR1); /* handler runs synchronously between mallocs */
            free(p);
        }
        CHECK(atomic_load(&handled) == 20000);
        return 0;
    }
    pthread_t self = pthread_self(), k;
    CHECK(pthread_create(&k, NULL, killer, &self) == 0);
    unsigned s = 1;
    void *keep[16] = {0};
    for (int i = 0; i < 300000 || atomic_load(&handled) < 100; i++) {
        int j = next_rand(&s) % 16;
        free(keep[j]);
        size_t n = next_rand(&s) % 5000 + 64; /* p(unsampled) = e^-64 */
        keep[j] = (i & 1) ? malloc(n) : realloc(NULL, n);
        CHECK(keep[j] != NULL);
        stamp(keep[j], n, 3);
        CHECK(stamped(keep[j], n, 3));
    }
    atomic_store(&stop_kill, 1);
    pthread_join(k, NULL);
    for (int j = 0; j < 16; j++) free(keep[j]);
    return 0;
}

/* ---- fork-reseed: a fork child must not sample in lockstep with its
 * parent (the sampler is reseeded in the child). Both run the same
 * allocation sequence and record which allocations were sampled. ---- */
struct alloc_stats { uint64_t sampled, unplaced, freed, live_pages; };
enum { RESEED_ALLOCS = 20000 };

static void sample_pattern(unsigned char *bits) {
    void (*stats)(struct alloc_stats *) =
        (void (*)(struct alloc_stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    CHECK(stats != NULL);
    struct alloc_stats st;
    stats(&st);
    uint64_t before = st.sampled;
    for (int i = 0; i < RESEED_ALLOCS; i++) {
        void *p = malloc(64);
        CHECK(p != NULL);
        stats(&st);
        bits[i] = st.sampled != before;
        before = st.sampled;
        free(p);
    }
}

static int run_fork_reseed(void) {
    /* Warm up: this thread's sampler is seeded before the fork. */
    free(malloc(100000));
    static unsigned char parent[RESEED_ALLOCS], child[RESEED_ALLOCS];
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        sample_pattern(child);
        size_t off = 0;
        while (off < sizeof child) {
            ssize_t n = write(fds[1], child + off, sizeof child - off);
            CHECK(n > 0);
            off += (size_t)n;
        }
        _exit(0);
    }
    /* The child's end only: a child that dies ends the read, not a hang. */
    close(fds[1]);
    sample_pattern(parent);
    size_t off = 0;
    while (off < sizeof child) {
        ssize_t n = read(fds[0], child + off, sizeof child - off);
        CHECK(n > 0);
        off += (size_t)n;
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int sampled_p = 0, sampled_c = 0, same = 1;
    for (int i = 0; i < RESEED_ALLOCS; i++) {
        sampled_p += parent[i];
        sampled_c += child[i];
        same &= parent[i] == child[i];
    }
    /* ALLOCPROF_RATE=4k: p = 1 - e^(-64/4096) per allocation, ~310 each. */
    CHECK(sampled_p > 100 && sampled_c > 100);
    CHECK(!same);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int rc = 2;
    if (!strcmp(argv[1], "threads")) rc = run_threads();
    else if (!strcmp(argv[1], "fork")) rc = run_fork();
    else if (!strcmp(argv[1], "fork-reseed")) rc = run_fork_reseed();
    else if (!strcmp(argv[1], "signals")) rc = run_signals(0);
    else if (!strcmp(argv[1], "signals-async")) rc = run_signals(1);
    if (rc == 0) printf("stress %s ok (signals handled: %d)\n", argv[1], atomic_load(&handled));
    return rc;
}
