/* A process whose main thread leaves with pthread_exit while a worker runs.
 * Protocol: on the first line the main thread allocates (main_site), starts
 * the worker and calls pthread_exit; the worker prints "leader-gone" once
 * /proc shows the main thread as a zombie, allocates (worker_site) on the
 * next line, prints "ready", and exits the process on the line after. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "leader.h"

#define N 20000
static void *blocks[2][N];

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
}

__attribute__((noinline)) void main_site(void) {
    for (int i = 0; i < N; i++) { blocks[0][i] = malloc(1024); ESCAPE(blocks[0][i]); }
}

__attribute__((noinline)) void worker_site(void) {
    for (int i = 0; i < N; i++) { blocks[1][i] = malloc(1024); ESCAPE(blocks[1][i]); }
}

static void *worker(void *arg) {
    (void)arg;
    while (!leader_is_zombie()) usleep(1000);
    printf("leader-gone\n");
    fflush(stdout);
    wait_line();
    worker_site();
    printf("ready\n");
    fflush(stdout);
    wait_line();
    exit(0);
}

int main(void) {
    wait_line();
    main_site();
    pthread_t t;
    if (pthread_create(&t, 0, worker, 0) != 0) return 3;
    pthread_exit(0);
}
