/* A workload with known allocation sites of very different sizes and
 * counts. Protocol on stdin/stdout so the test can attach first:
 *   waits for a line, allocates, prints "ready", waits for a line, exits.
 * With argv[1] = a shared library path, it also dlopens that library after
 * the first line and calls its `plugin_alloc(n)` (allocations seen through
 * a library loaded after attach). With argv[1] = "--exec", the last line
 * makes it exec itself (a new image under the same pid) instead of exiting.
 * With WORKLOAD_COMM set, it names itself that (prctl PR_SET_NAME) first. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define N_SMALL 200000
#define N_MEDIUM 2000
#define N_LARGE 8
#define N_FREED 100000

static void *small[N_SMALL], *medium[N_MEDIUM], *large[N_LARGE];

/* Keeps the compiler from proving an allocation unused and dropping it. */
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
}

__attribute__((noinline)) void site_small(void) {
    for (int i = 0; i < N_SMALL; i++) { small[i] = malloc(64); ESCAPE(small[i]); }
}

__attribute__((noinline)) void site_medium(void) {
    /* Written after calloc: mimalloc hands out fresh, known-zero pages
     * without touching them, and the tests find the live heap resident. */
    for (int i = 0; i < N_MEDIUM; i++) {
        medium[i] = calloc(1, 8192);
        memset(medium[i], 1, 8192);
        ESCAPE(medium[i]);
    }
}

__attribute__((noinline)) void site_large(void) {
    for (int i = 0; i < N_LARGE; i++) {
        large[i] = malloc(1 << 20);
        memset(large[i], 1, 1 << 20);
        ESCAPE(large[i]);
    }
}

__attribute__((noinline)) void site_freed(void) {
    for (int i = 0; i < N_FREED; i++) {
        void *p = malloc(256);
        ESCAPE(p);
        free(p);
    }
}

int main(int argc, char **argv) {
    const char *comm = getenv("WORKLOAD_COMM");
    if (comm) prctl(PR_SET_NAME, comm, 0, 0, 0);
    wait_line();
    site_small();
    site_medium();
    site_large();
    site_freed();
    int exec_self = argc > 1 && !strcmp(argv[1], "--exec");
    if (argc > 1 && !exec_self) {
        void *lib = dlopen(argv[1], RTLD_NOW);
        if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 3; }
        void (*plugin_alloc)(int) = (void (*)(int))dlsym(lib, "plugin_alloc");
        if (!plugin_alloc) return 4;
        plugin_alloc(4000);
    }
    printf("ready\n");
    fflush(stdout);
    wait_line();
    if (exec_self) {
        execl("/proc/self/exe", argv[0], (char *)0);
        return 5;
    }
    return 0;
}
