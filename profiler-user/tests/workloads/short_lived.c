/* A short-lived process: allocates two 1 MiB blocks (at R = 64 KiB each is
 * sampled with p ≈ 1 - e^-16 and weighs its size) and exits holding them. */
#include <stdlib.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void short_lived_site(void) {
    for (int i = 0; i < 2; i++) {
        void *p = malloc(1 << 20);
        ESCAPE(p);
    }
}

int main(void) {
    short_lived_site();
    return 0;
}
