/* Huge and numerous live blocks, never touched (address space only, so RSS
 * stays small): 2 x 256 MiB, 1 x 1 GiB and 1,100 x 3 MiB, more than the
 * 1,024 slots of the sample region's 4 MiB class. Same stdin/stdout
 * protocol as alloc_sites.c: waits for a line, allocates, prints "ready",
 * waits for a line, exits. */
#include <stdio.h>
#include <stdlib.h>

#define N_256M 2
#define N_1G 1
#define N_3M 1100

static void *keep[N_256M + N_1G + N_3M];
static int n;

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
}

static void *must(void *p) {
    if (!p) { fprintf(stderr, "malloc failed\n"); exit(1); }
    ESCAPE(p);
    return p;
}

__attribute__((noinline)) void site_256m(void) {
    for (int i = 0; i < N_256M; i++) keep[n++] = must(malloc((size_t)256 << 20));
}

__attribute__((noinline)) void site_1g(void) {
    for (int i = 0; i < N_1G; i++) keep[n++] = must(malloc((size_t)1 << 30));
}

__attribute__((noinline)) void site_3m(void) {
    for (int i = 0; i < N_3M; i++) keep[n++] = must(malloc((size_t)3 << 20));
}

int main(void) {
    wait_line();
    site_256m();
    site_1g();
    site_3m();
    printf("ready\n");
    fflush(stdout);
    wait_line();
    for (int i = 0; i < n; i++) free(keep[i]);
    return 0;
}
