/* Grows one stack until the kernel's OOM killer kills it: prints
 * "started", waits for a line, then allocates and touches 1 MiB blocks
 * at grow_site, never freeing them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (1 << 20)

__attribute__((noinline)) void *grow_site(size_t n) {
    char *p = malloc(n);
    if (p) memset(p, 5, n);
    return p;
}

int main(void) {
    char line[16];
    printf("started\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    for (;;) {
        void *p = grow_site(BLOCK);
        __asm__ volatile("" : : "r"(p) : "memory");
    }
}
