/* A scripted emitter of the otel_memory probes, for tests that drive the
 * kernel programs event by event. One command per stdin line, each
 * answered with "ok" once its probe has fired:
 *   a PTR SIZE WEIGHT DEPTH   alloc probe, fired DEPTH calls deep (distinct
 *                             depths give distinct user stacks)
 *   f PTR                     free probe
 *   m ADDR SIZE / u ADDR SIZE mmap / munmap probe
 * It exits at end of input. */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/sdt.h>

__attribute__((noinline)) static void fire_alloc(uintptr_t ptr, uint64_t size, uint64_t weight) {
    DTRACE_PROBE3(otel_memory, alloc, ptr, size, weight);
}

__attribute__((noinline)) static void fire_free(uintptr_t ptr) {
    DTRACE_PROBE1(otel_memory, free, ptr);
}

__attribute__((noinline)) static void alloc_at_depth(int depth, uintptr_t ptr, uint64_t size,
                                                     uint64_t weight) {
    if (depth > 1)
        alloc_at_depth(depth - 1, ptr, size, weight);
    else
        fire_alloc(ptr, size, weight);
    __asm__ volatile("" ::: "memory"); /* not a tail call: keep the frame */
}

__attribute__((noinline)) static void fire_mapping(int unmap, uintptr_t addr, uint64_t size) {
    if (unmap)
        DTRACE_PROBE2(otel_memory, munmap, addr, size);
    else
        DTRACE_PROBE2(otel_memory, mmap, addr, size);
}

int main(void) {
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long ptr, size, weight;
        int depth;
        if (sscanf(line, "a %llx %llu %llu %d", &ptr, &size, &weight, &depth) == 4)
            alloc_at_depth(depth, ptr, size, weight);
        else if (sscanf(line, "f %llx", &ptr) == 1)
            fire_free(ptr);
        else if (sscanf(line, "m %llx %llu", &ptr, &size) == 2)
            fire_mapping(0, ptr, size);
        else if (sscanf(line, "u %llx %llu", &ptr, &size) == 2)
            fire_mapping(1, ptr, size);
        else
            return 64;
        printf("ok\n");
        fflush(stdout);
    }
    return 0;
}
