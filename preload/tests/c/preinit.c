/* Allocations before the environment is set up: a .preinit_array function
 * runs before libc's initialiser, with `environ` still null, and allocates
 * (small blocks, and one 64 MiB block that any sampling rate but 0 samples,
 * so the sample region and its ledger are set up here). main then makes
 * 1,000 allocations of 100 bytes. Prints
 * "preinit sampled=N main_sampled=M of 1000"; with argv[1] = "wait" it then
 * prints "ready" and waits for stdin to close (for a look from outside). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

struct stats { uint64_t sampled, unplaced, freed, live_pages; };

static void *early_big;
static int environ_was_null;

static void early(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    environ_was_null = environ == NULL;
    for (int i = 0; i < 16; i++) free(malloc(100));
    early_big = malloc(64 << 20);
}
__attribute__((section(".preinit_array"), used)) static void (*early_p)(int, char **, char **) = early;

static struct stats stats(void) {
    struct stats s = {0};
    void (*f)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (f) f(&s);
    return s;
}

int main(int argc, char **argv) {
    if (!environ_was_null) {
        fprintf(stderr, "environ was already set in .preinit_array: the test tests nothing\n");
        return 1;
    }
    if (early_big == NULL) return 1;
    static void *blocks[1000];
    struct stats before = stats();
    for (int i = 0; i < 1000; i++) blocks[i] = malloc(100);
    struct stats after = stats();
    printf("preinit sampled=%lu main_sampled=%lu of 1000\n", (unsigned long)after.sampled,
           (unsigned long)(after.sampled - before.sampled));
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        printf("ready\n");
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {}
    }
    for (int i = 0; i < 1000; i++) free(blocks[i]);
    free(early_big);
    return 0;
}
