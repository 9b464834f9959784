/* dlopens the library argv[1] (tests/workloads/plugin.c), allocates through
 * it and keeps the blocks live, then dlcloses it and allocates through its
 * own code. Protocol: a line → dlopen, plugin_alloc(4000), "loaded"; a line
 * → dlclose (checked unmapped), main_alloc, "ready"; a line → exit 0. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *kept[2000];

static void wait_line(void) {
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) exit(2);
}

__attribute__((noinline)) void main_alloc(void) {
    for (int i = 0; i < 2000; i++) { kept[i] = malloc(8192); ESCAPE(kept[i]); }
}

/* Whether `path` is still mapped. */
static int mapped(const char *path) {
    char line[4096];
    int found = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) exit(6);
    while (fgets(line, sizeof line, maps))
        if (strstr(line, path)) found = 1;
    fclose(maps);
    return found;
}

int main(int argc, char **argv) {
    if (argc < 2) return 64;
    wait_line();
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 3; }
    void (*plugin_alloc)(int) = (void (*)(int))dlsym(lib, "plugin_alloc");
    if (!plugin_alloc) return 4;
    plugin_alloc(4000);
    printf("loaded\n");
    fflush(stdout);
    wait_line();
    if (dlclose(lib)) return 5;
    if (mapped(argv[1])) { fprintf(stderr, "still mapped after dlclose\n"); return 7; }
    main_alloc();
    printf("ready\n");
    fflush(stdout);
    wait_line();
    return 0;
}
