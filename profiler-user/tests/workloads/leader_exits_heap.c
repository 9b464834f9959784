/* A heap allocated before allocprof attaches, by a main thread that then
 * leaves with pthread_exit while a worker runs (its /proc/PID reads as a
 * zombie, and process_vm_readv of PID fails). On "go" the main thread
 * allocates N blocks of SIZE from main_site (125 MiB), starts the worker
 * and calls pthread_exit; the worker prints "leader-gone" once /proc shows
 * the main thread as a zombie, and exits the process on the next line. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "leader.h"

#define N 2000
#define SIZE 65536

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *blocks[N];

__attribute__((noinline)) void main_site(void) {
    for (int i = 0; i < N; i++) { blocks[i] = malloc(SIZE); ESCAPE(blocks[i]); }
}

static void *worker(void *arg) {
    (void)arg;
    while (!leader_is_zombie()) usleep(1000);
    printf("leader-gone\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(2);
    exit(0);
}

int main(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 2;
    main_site();
    pthread_t t;
    if (pthread_create(&t, 0, worker, 0) != 0) return 3;
    pthread_exit(0);
}
