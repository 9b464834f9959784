/* Allocation sites in code built without frame pointers (-O2
 * -fomit-frame-pointer, no sibling calls so every caller keeps a frame):
 * behind one and two levels of helpers (as xmalloc, g_malloc do), and at
 * the bottom of a 100-deep recursion. Waits for a line, allocates (blocks
 * stay live), prints "ready", and exits on the next line. */
#include <stdio.h>
#include <stdlib.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    ESCAPE(p);
    return p;
}

__attribute__((noinline)) void *xmalloc_twice_removed(size_t n) {
    void *p = xmalloc(n);
    ESCAPE(p);
    return p;
}

__attribute__((noinline)) void site_one_level(void) {
    for (int i = 0; i < 2000; i++) ESCAPE(xmalloc(4096));
}

__attribute__((noinline)) void site_two_levels(void) {
    for (int i = 0; i < 1000; i++) ESCAPE(xmalloc_twice_removed(8192));
}

__attribute__((noinline)) int recurse(int depth) {
    if (depth == 0) {
        for (int i = 0; i < 512; i++) ESCAPE(malloc(16384));
        return 0;
    }
    int r = recurse(depth - 1);
    ESCAPE(&r);
    return r + 1;
}

int main(void) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    site_one_level();
    site_two_levels();
    recurse(100);
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
