/* N large allocations with distinct sizes, then their frees: under
 * ALLOCPROF_RATE=1 every one is sampled and must fire otel_memory:alloc
 * (size = 1 MiB + i pages) and otel_memory:free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    void **blocks = calloc((size_t)n, sizeof *blocks);
    for (int i = 0; i < n; i++) {
        size_t size = (1u << 20) + (size_t)i * 4096;
        blocks[i] = malloc(size);
        if (!blocks[i]) return 1;
        memset(blocks[i], i, size);
    }
    for (int i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    printf("probes done %d\n", n);
    return 0;
}
