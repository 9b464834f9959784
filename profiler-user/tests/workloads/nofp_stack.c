/* A deep call chain, built by tests/unwind_tables.rs without frame pointers
 * (and with, as a control): main -> helper_a -> helper_b -> recurse x100 ->
 * leaf. The leaf captures pc (lea of itself), rsp and rbp, then writes into
 * the directory argv[1]:
 *   regs   "pc HEX\nrsp HEX\nrbp HEX\n"
 *   stack  the raw bytes from rsp up to the end of [stack] (at most 1 MiB)
 *   maps   a copy of /proc/self/maps
 * so the test can unwind that stack on the host with the compiled tables.
 * Each caller uses a volatile local after its call: no tail calls, no
 * recursion turned into a loop, and a stack frame in every function. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOIPA __attribute__((noinline, noclone))

static const char *out_dir;
static char maps[1 << 18];
#define MAX_STACK (1 << 20)

static FILE *open_out(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    return f;
}

NOIPA void dump(uint64_t pc, uint64_t rsp, uint64_t rbp) {
    FILE *in = fopen("/proc/self/maps", "r");
    if (!in) {
        perror("/proc/self/maps");
        exit(1);
    }
    size_t len = fread(maps, 1, sizeof maps - 1, in);
    fclose(in);
    maps[len] = 0;
    uint64_t stack_end = 0;
    for (char *line = maps; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char *eol = strchr(line, '\n');
        char *tag = strstr(line, "[stack]");
        if (tag && (!eol || tag < eol)) {
            unsigned long lo, hi;
            if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && rsp >= lo && rsp < hi)
                stack_end = hi;
        }
    }
    if (!stack_end) {
        fprintf(stderr, "rsp %#lx is in no [stack] mapping\n", (unsigned long)rsp);
        exit(1);
    }
    uint64_t size = stack_end - rsp;
    if (size > MAX_STACK)
        size = MAX_STACK;

    FILE *f = open_out("regs");
    fprintf(f, "pc %lx\nrsp %lx\nrbp %lx\n", (unsigned long)pc, (unsigned long)rsp,
            (unsigned long)rbp);
    fclose(f);
    f = open_out("stack");
    fwrite((const void *)(uintptr_t)rsp, 1, size, f);
    fclose(f);
    f = open_out("maps");
    fwrite(maps, 1, len, f);
    fclose(f);
}

NOIPA int leaf(int n) {
    volatile int keep = n;
    uint64_t pc, rsp, rbp;
    __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
                     : "=r"(pc), "=r"(rsp), "=r"(rbp));
    dump(pc, rsp, rbp);
    return keep + 1;
}

NOIPA int recurse(int n) {
    volatile int keep = n;
    int r = n <= 1 ? leaf(n) : recurse(n - 1);
    return r + keep;
}

NOIPA int helper_b(int n) {
    volatile int keep = n;
    int r = recurse(n);
    return r + keep;
}

NOIPA int helper_a(int n) {
    volatile int keep = n;
    int r = helper_b(n);
    return r + keep;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    int r = helper_a(100);
    printf("%d\n", r);
    return 0;
}
