/* A fragmented heap: waits for a line, allocates N blocks of SIZE bytes
 * (touched), frees every other one, prints "ready", exits on the next
 * line. Half the blocks are live; the pages of the freed half stay
 * resident between them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 20000
#define SIZE 4096

static void *blocks[N];

__attribute__((noinline)) void *fragment_site(size_t n) {
    void *p = malloc(n);
    memset(p, 3, n);
    return p;
}

int main(void) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    for (int i = 0; i < N; i++) blocks[i] = fragment_site(SIZE);
    for (int i = 0; i < N; i += 2) {
        free(blocks[i]);
        blocks[i] = NULL;
    }
    /* The program goes on a little, as programs do: its allocator's own
     * figures (refreshed on sampled allocations, a few ms apart at most)
     * then show the heap after the frees. */
    usleep(50 * 1000);
    for (int i = 0; i < 64; i++) free(malloc(16384));
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
