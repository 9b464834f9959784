/* Not CPython, but exporting what allocprof recognises CPython by: a
 * 64 KiB `_PyRuntime` (initialized data, as CPython's is) and a
 * `Py_Version` (PY_VERSION_HEX, 3.11.4 unless -D says otherwise); built
 * with -rdynamic so both are dynamic symbols. What `_PyRuntime` holds at
 * run time:
 *   default        zeros (an interpreter not initialised yet looks so);
 *   -DPATTERN=B    every byte B (0x41: its interpreter list no pointer);
 *   -DSELF_POINTERS every word the runtime's own address (a pointer that
 *                  reads back as itself: a list that loops on itself).
 * Commands, one per line on stdin:
 *   go    site_fake: COUNT blocks of SIZE, kept  -> "ready"
 *   exit  exits */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PY_VERSION_HEX
#define PY_VERSION_HEX 0x030b04f0
#endif

#define COUNT 64
#define SIZE (64 * 1024)

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

/* In .data, with file contents, like CPython's (a .bss one is refused
 * before any process is looked at). */
__attribute__((section(".data"), aligned(64))) unsigned char _PyRuntime[64 * 1024];
const unsigned long Py_Version = PY_VERSION_HEX;

static void *blocks[COUNT];

__attribute__((noinline)) void site_fake(void) {
    for (int i = 0; i < COUNT; i++) {
        blocks[i] = malloc(SIZE);
        ESCAPE(blocks[i]);
    }
}

int main(void) {
#if defined(PATTERN)
    memset(_PyRuntime, PATTERN, sizeof _PyRuntime);
#elif defined(SELF_POINTERS)
    for (size_t i = 0; i < sizeof _PyRuntime / 8; i++)
        ((uint64_t *)_PyRuntime)[i] = (uint64_t)(uintptr_t)_PyRuntime;
#endif
    ESCAPE(&Py_Version);
    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "go", 2) == 0) {
            site_fake();
            puts("ready");
        } else if (strncmp(line, "exit", 4) == 0) {
            return 0;
        }
    }
    return 0;
}
