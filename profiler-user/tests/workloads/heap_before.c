/* A heap allocated before allocprof attaches, at known sites, for the
 * live-sample ledger tests. Commands, one per line on stdin; each answers
 * one line on stdout:
 *   alloc   site_a: N_A blocks of SIZE_A, site_b: N_B of SIZE_B  -> "ready"
 *   half    frees the first half of site_a's blocks              -> "ready"
 *   fork    forks a child that frees the first half of site_a's
 *           blocks (inherited), allocates site_c: N_C of SIZE_C,
 *           and waits; the child answers                         -> "child <pid>"
 *   reap    tells the child to exit and reaps it                 -> "reaped <status>"
 *   churn   starts 2 threads, each keeping N_CHURN blocks of
 *           SIZE_CHURN live from site_churn and replacing them
 *           without pause                                        -> "ready"
 *   exit    exits */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_A 4000
#define SIZE_A 4096
#define N_B 200
#define SIZE_B 65536
#define N_C 3000
#define SIZE_C 2048
#define N_CHURN 2000
#define SIZE_CHURN 8192

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *a[N_A], *b[N_B], *c[N_C];

__attribute__((noinline)) void site_a(void) {
    for (int i = 0; i < N_A; i++) { a[i] = malloc(SIZE_A); ESCAPE(a[i]); }
}

__attribute__((noinline)) void site_b(void) {
    for (int i = 0; i < N_B; i++) { b[i] = malloc(SIZE_B); ESCAPE(b[i]); }
}

__attribute__((noinline)) void site_c(void) {
    for (int i = 0; i < N_C; i++) { c[i] = malloc(SIZE_C); ESCAPE(c[i]); }
}

static void free_half_a(void) {
    for (int i = 0; i < N_A / 2; i++) { free(a[i]); a[i] = 0; }
}

__attribute__((noinline)) void *site_churn(void) {
    void *p = malloc(SIZE_CHURN);
    ESCAPE(p);
    return p;
}

static int filled;

static void *churn(void *arg) {
    void **live = calloc(N_CHURN, sizeof *live);
    unsigned seed = (unsigned)(long)arg;
    for (int i = 0; i < N_CHURN; i++) live[i] = site_churn();
    __atomic_add_fetch(&filled, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        int i = rand_r(&seed) % N_CHURN;
        free(live[i]);
        live[i] = site_churn();
    }
    return 0;
}

static void answer(const char *s) {
    printf("%s\n", s);
    fflush(stdout);
}

int main(void) {
    char line[64];
    int release[2] = {-1, -1};
    pid_t child = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "alloc", 5)) {
            site_a();
            site_b();
            answer("ready");
        } else if (!strncmp(line, "half", 4)) {
            free_half_a();
            answer("ready");
        } else if (!strncmp(line, "fork", 4)) {
            if (pipe(release)) return 2;
            child = fork();
            if (child < 0) return 3;
            if (child == 0) {
                char byte;
                free_half_a();
                site_c();
                printf("child %d\n", getpid());
                fflush(stdout);
                if (read(release[0], &byte, 1) < 0) _exit(4);
                _exit(0);
            }
        } else if (!strncmp(line, "reap", 4)) {
            int status = -1;
            if (write(release[1], "x", 1) != 1) return 5;
            waitpid(child, &status, 0);
            printf("reaped %d\n", status);
            fflush(stdout);
        } else if (!strncmp(line, "churn", 5)) {
            static pthread_t threads[2];
            for (long i = 0; i < 2; i++)
                if (pthread_create(&threads[i], 0, churn, (void *)(i + 1))) return 6;
            while (__atomic_load_n(&filled, __ATOMIC_SEQ_CST) < 2) usleep(1000);
            answer("ready");
        } else if (!strncmp(line, "exit", 4)) {
            return 0;
        }
    }
    return 0;
}
