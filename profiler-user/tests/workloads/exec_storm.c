/* Execs itself argv[1] times in a row, allocating in each image: an exec
 * storm. Waits for a line first; the last image prints "ready" and exits
 * on the next line. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void storm_site(void) {
    for (int i = 0; i < 2000; i++) { void *p = malloc(1024); ESCAPE(p); }
}

int main(int argc, char **argv) {
    char buf[64];
    int left = argc > 1 ? atoi(argv[1]) : 0;
    int first = argc < 3;
    if (first && !fgets(buf, sizeof buf, stdin)) return 2;
    storm_site();
    if (left > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", left - 1);
        execl("/proc/self/exe", argv[0], n, "again", (char *)0);
        return 5;
    }
    printf("ready\n");
    fflush(stdout);
    if (!fgets(buf, sizeof buf, stdin)) return 2;
    return 0;
}
