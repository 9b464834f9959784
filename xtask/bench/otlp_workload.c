/* Target side of `cargo xtask bench otlp`, one of many, run under LD_PRELOAD
 * with ALLOCPROF_RATE=1 so that every allocation is sampled.
 *
 * Allocates BLOCKS blocks from each of 40 distinct call stacks (a leaf
 * function per site, reached through a few nested frames as in a real
 * program), keeps them live, prints `ready`, then idles until its stdin
 * reaches end of file (the harness closes the one pipe all copies share, so
 * every copy exits even if the harness dies). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SITES 40
#define BLOCKS 2
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *kept[SITES * BLOCKS];
static int nkept;

/* A distinct leaf per site: its own function name in every frame chain.
 * Sizes differ by site (called in order) so that each stack's bytes are
 * told apart. */
#define SITE(n)                                                              \
    __attribute__((noinline, noclone)) static void site_##n(void) {         \
        size_t size = 256 + 64 * (nkept / BLOCKS); /* the site's index */    \
        for (int i = 0; i < BLOCKS; i++) {                                   \
            void *p = malloc(size);                                          \
            ESCAPE(p);                                                       \
            kept[nkept++] = p;                                               \
        }                                                                    \
    }
#define TEN(d) SITE(d##0) SITE(d##1) SITE(d##2) SITE(d##3) SITE(d##4) \
               SITE(d##5) SITE(d##6) SITE(d##7) SITE(d##8) SITE(d##9)
/* site_0 .. site_39 (site_00..site_09 for the first ten). */
TEN(0) TEN(1) TEN(2) TEN(3)

typedef void (*site_fn)(void);
#define ADDR(n) site_##n,
#define TEN_ADDR(d) ADDR(d##0) ADDR(d##1) ADDR(d##2) ADDR(d##3) ADDR(d##4) \
                    ADDR(d##5) ADDR(d##6) ADDR(d##7) ADDR(d##8) ADDR(d##9)
static site_fn sites[SITES] = {TEN_ADDR(0) TEN_ADDR(1) TEN_ADDR(2) TEN_ADDR(3)};

/* A frame per level (no tail call, no loop): stacks about 10 frames deep. */
__attribute__((noinline, noclone)) static void nested(site_fn f, int depth) {
    if (depth == 0) {
        f();
        return;
    }
    nested(f, depth - 1);
    __asm__ volatile("" ::: "memory");
}

int main(void) {
    for (int i = 0; i < SITES; i++) nested(sites[i], 4);
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    for (int i = 0; i < nkept; i++) free(kept[i]);
    return 0;
}
