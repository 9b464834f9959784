/* A library built without call-frame information or frame pointers
 * (-fno-asynchronous-unwind-tables -fno-unwind-tables -fomit-frame-pointer):
 * a stack through it cannot be unwound past it. */
#include <stdlib.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void *nocfi_alloc(size_t n) {
    void *p = malloc(n);
    ESCAPE(p);
    return p;
}
