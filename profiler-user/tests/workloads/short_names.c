/* Allocation sites whose names are short plain C names that read as C++
 * type encodings to a demangler that tries every name (`ra`: "signed char
 * restrict"). Waits for a line, allocates (kept live), prints "ready",
 * exits on the next line. */
#include <stdio.h>
#include <stdlib.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void ra(void) { for (int i = 0; i < 64; i++) ESCAPE(malloc(1 << 20)); }
__attribute__((noinline)) void rb(void) { for (int i = 0; i < 64; i++) ESCAPE(malloc(1 << 20)); }
__attribute__((noinline)) void rc(void) { for (int i = 0; i < 64; i++) ESCAPE(malloc(1 << 20)); }

int main(void) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    ra();
    rb();
    rc();
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
