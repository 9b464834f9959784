/* Allocates through libnocfi.so (no call-frame information), from code
 * built without frame pointers. Waits for a line, allocates 1000 blocks of
 * 8 KiB (kept live), prints "ready", exits on the next line. */
#include <stdio.h>
#include <stdlib.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

void *nocfi_alloc(size_t n);

__attribute__((noinline)) void call_into_nocfi(void) {
    for (int i = 0; i < 1000; i++) ESCAPE(nocfi_alloc(8192));
}

int main(void) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    call_into_nocfi();
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
