/* A library the workload dlopens after allocprof attached. It allocates
 * through malloc and also fires otel_memory probes of its own (as another
 * emitter of the contract would), at fake addresses. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/sdt.h>

static void *kept[100000];

__attribute__((noinline)) void plugin_alloc(int n) {
    for (int i = 0; i < n && i < 100000; i++) { kept[i] = malloc(4096); __asm__ volatile("" : : "r"(kept[i]) : "memory"); }
    for (uint64_t i = 0; i < 10; i++) {
        uint64_t ptr = 0x7000 + 16 * i, size = 100, weight = 1000;
        DTRACE_PROBE3(otel_memory, alloc, ptr, size, weight);
    }
}
