/* Fires otel_memory probes through <sys/sdt.h> (another emitter of the
 * contract than our allocator), with known values:
 *   argv[1] = number of allocs, argv[2] = size, argv[3] = weight,
 *   argv[4] = how many of them to free,
 *   argv[5] (optional) = how many more to fire with pointer 0 (samples the
 *   emitter cannot track: it will never report their free).
 * It waits for a line on stdin before firing (so the profiler can attach),
 * prints "fired", and waits for another line before exiting. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/sdt.h>

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
}

__attribute__((noinline)) static void fire_alloc(uintptr_t ptr, uint64_t size, uint64_t weight) {
    DTRACE_PROBE3(otel_memory, alloc, ptr, size, weight);
}

__attribute__((noinline)) static void fire_free(uintptr_t ptr) {
    DTRACE_PROBE1(otel_memory, free, ptr);
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) return 64;
    long n = atol(argv[1]), freed = atol(argv[4]);
    long untracked = argc == 6 ? atol(argv[5]) : 0;
    uint64_t size = strtoull(argv[2], 0, 0), weight = strtoull(argv[3], 0, 0);
    wait_line();
    for (long i = 0; i < n; i++) fire_alloc(0x10000 + 64 * i, size, weight);
    for (long i = 0; i < freed; i++) fire_free(0x10000 + 64 * i);
    for (long i = 0; i < untracked; i++) fire_alloc(0, size, weight);
    printf("fired\n");
    fflush(stdout);
    wait_line();
    return 0;
}
