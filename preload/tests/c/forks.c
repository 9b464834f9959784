/* forks N: samples (run at rate 1 under an attached tracer: the kernel then
 * optimizes the fast probe sites into calls to this process's
 * [uprobes-trampoline] page), prints "trampoline yes|no", then forks N
 * children that each allocate and free, a grandchild included, and exit 0.
 * Prints "crashed <m>" and exits with 0 only if every one exited with 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void churn(void) {
    for (int i = 0; i < 1000; i++) {
        void *p = malloc(16 + i % 200);
        ESCAPE(p);
        free(p);
    }
}

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

/* Forks a child that churns (and, if deeper, forks its own); its status. */
static int child(int deeper) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        churn();
        _exit(deeper && child(0) != 0 ? 1 : 0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20;
    churn();
    printf("trampoline %s\n", has_trampoline() ? "yes" : "no");
    int crashed = 0;
    for (int i = 0; i < n; i++)
        if (child(i == 0) != 0) crashed++;
    printf("crashed %d\n", crashed);
    return crashed != 0;
}
