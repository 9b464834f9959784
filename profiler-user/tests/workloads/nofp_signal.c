/* A signal handler that allocates, in code built -O2 -fomit-frame-pointer:
 * main raises SIGUSR1 500 times; the handler calls a helper that keeps a
 * 16 KiB block live (never while main is inside malloc: raise is
 * synchronous). Waits for a line, raises, prints "ready", and exits on the
 * next line. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

__attribute__((noinline)) void handler_alloc(void) {
    void *p = malloc(16384);
    if (!p) abort();
    ESCAPE(p);
}

__attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    handler_alloc();
    __asm__ volatile("");
}

__attribute__((noinline)) void raise_many(void) {
    for (int i = 0; i < 500; i++) raise(SIGUSR1);
    __asm__ volatile("");
}

int main(void) {
    char line[16];
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL)) return 3;
    if (!fgets(line, sizeof line, stdin)) return 2;
    raise_many();
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
