/* An emitter whose weights fit no known form (and one sample it cannot
 * track), which then replaces itself by exec:
 *   exec_weights        waits for a line, fires, prints "fired"; on the
 *                       next line execs itself as `exec_weights again`
 *   exec_weights again  prints "again", exits at end of input.
 * Through <sys/sdt.h> (another emitter than our allocator). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/sdt.h>

__attribute__((noinline)) static void fire_alloc(uintptr_t ptr, uint64_t size, uint64_t weight) {
    DTRACE_PROBE3(otel_memory, alloc, ptr, size, weight);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    char line[64];
    if (argc > 1 && !strcmp(argv[1], "again")) {
        printf("again\n");
        fflush(stdout);
        while (fgets(line, sizeof line, stdin))
            ;
        return 0;
    }
    if (!fgets(line, sizeof line, stdin))
        return 2;
    /* Not multiples of one another, and some below their size: neither
     * `size / p` nor `nsamples × R`. */
    for (uint64_t i = 0; i < 100; i++) {
        fire_alloc(0x10000 + 64 * i, 5000, 4097 + i);
        fire_alloc(0x80000 + 64 * i, 100, 65636 + 7 * i);
    }
    /* One it cannot track: the live figure becomes a lower bound. */
    fire_alloc(0, 1 << 20, 3 << 20);
    printf("fired\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 0;
    char *again[] = {argv[0], "again", 0};
    execv(argv[0], again);
    return 3;
}
