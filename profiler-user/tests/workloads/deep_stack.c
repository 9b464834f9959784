/* A stack deeper than the kernel keeps (127 frames): main -> deep x
 * argv[1] (e.g. 200) -> deep_alloc, which allocates 256 blocks of 64 KiB
 * and keeps them. On a line, allocates, prints "ready"; the next line
 * exits. Each caller uses a volatile local after its call: no tail calls,
 * no recursion turned into a loop, with or without frame pointers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOIPA __attribute__((noinline, noclone))
#define BLOCKS 256
#define SIZE (64 << 10)

static void *kept[BLOCKS];

NOIPA int deep_alloc(int n) {
    volatile int keep = n;
    for (int i = 0; i < BLOCKS; i++) {
        kept[i] = malloc(SIZE);
        if (!kept[i]) abort();
        memset(kept[i], i, SIZE);
    }
    return keep;
}

NOIPA int deep(int n) {
    volatile int keep = n;
    int r = n <= 1 ? deep_alloc(n) : deep(n - 1);
    return r + keep;
}

int main(int argc, char **argv) {
    char buf[64];
    if (argc != 2) {
        fprintf(stderr, "usage: %s DEPTH\n", argv[0]);
        return 2;
    }
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    int r = deep(atoi(argv[1]));
    printf("ready\n");
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    return r == 0;
}
