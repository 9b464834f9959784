/* Fork children of a process whose probes already fired. On a line, the
 * parent samples (the test runs it at rate 1, under an attached allocprof:
 * the kernel then
 * optimizes the fast probe sites into calls to this process's
 * [uprobes-trampoline] page, which fork does not copy), prints whether it has
 * that page ("trampoline yes|no"), then forks CHILDREN children. Each child
 * allocates and frees, keeps one block of 1 MiB live from fork_child_keep,
 * reports, and waits until the parent tells it to exit. Once all reported,
 * the parent prints "ready"; on a line it releases them, reaps them and
 * prints "children <n> crashed <m>" (m = children not exiting with 0); it
 * exits with 0 only if m is 0. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILDREN 20
#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static int has_trampoline(void) {
    char line[512];
    int found = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    while (fgets(line, sizeof line, maps))
        if (strstr(line, "[uprobes-trampoline]")) found = 1;
    fclose(maps);
    return found;
}

static void churn(void) {
    for (int i = 0; i < 1000; i++) {
        void *p = malloc(16 + i % 200);
        ESCAPE(p);
        free(p);
    }
}

__attribute__((noinline)) static void *fork_child_keep(void) {
    void *p = malloc(1 << 20);
    ESCAPE(p);
    return p;
}

int main(void) {
    int reported[2], release[2];
    if (pipe(reported) || pipe(release)) return 2;
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 6;
    churn();
    printf("trampoline %s\n", has_trampoline() ? "yes" : "no");
    fflush(stdout);
    pid_t kids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        kids[i] = fork();
        if (kids[i] < 0) return 3;
        if (kids[i] == 0) {
            close(reported[0]);
            close(release[1]);
            churn();
            void *keep = fork_child_keep();
            if (!keep) _exit(4);
            if (write(reported[1], "c", 1) != 1) _exit(5);
            char c;
            while (read(release[0], &c, 1) > 0) {}
            free(keep);
            _exit(0);
        }
    }
    close(reported[1]);
    close(release[0]);
    /* A child that crashed closes its end without reporting. */
    char c;
    int alive = 0;
    while (alive < CHILDREN && read(reported[0], &c, 1) == 1) alive++;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 6;
    close(release[1]);
    int crashed = 0;
    for (int i = 0; i < CHILDREN; i++) {
        int status;
        if (waitpid(kids[i], &status, 0) != kids[i] || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            crashed++;
    }
    printf("children %d crashed %d\n", CHILDREN, crashed);
    return crashed != 0;
}
