/* A process that forges its live-sample ledger (as any process may: the
 * ledger is in its own memory), for the tests that check allocprof caps
 * what a ledger may cost it. It first allocates from site_a, so that the
 * library's sample region and ledger exist. argv: the record layout of
 * profiler_common::ledger (words per record; indices of seq, ptr, size,
 * weight, time, flags, nframes, frames; frames per record; the live flag).
 * Commands, one per line on stdin:
 *   table N SIZE WEIGHT BASE  builds a table of N live records, each of
 *                             SIZE bytes and WEIGHT, at BASE + i * 4096,
 *                             with N distinct stacks          -> "table <hex>"
 *   exit
 * After "table" it allocates nothing (a sampled allocation would rewrite
 * the header the test forges) and answers with write(2). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define N_A 400
#define SIZE_A 65536

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static void *a[N_A];

__attribute__((noinline)) void site_a(void) {
    for (int i = 0; i < N_A; i++) { a[i] = malloc(SIZE_A); ESCAPE(a[i]); }
}

static int read_line(char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(0, buf + n, 1);
        if (r <= 0) return -1;
        if (buf[n] == '\n') break;
        n++;
    }
    buf[n] = 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 12) return 2;
    unsigned long words = strtoul(argv[1], 0, 10), seq = strtoul(argv[2], 0, 10),
                  ptr = strtoul(argv[3], 0, 10), size_w = strtoul(argv[4], 0, 10),
                  weight_w = strtoul(argv[5], 0, 10), time_w = strtoul(argv[6], 0, 10),
                  flags_w = strtoul(argv[7], 0, 10), nframes_w = strtoul(argv[8], 0, 10),
                  frames_w = strtoul(argv[9], 0, 10), frames = strtoul(argv[10], 0, 10),
                  live = strtoul(argv[11], 0, 10);
    site_a();
    char line[256];
    while (read_line(line, sizeof line) == 0) {
        unsigned long n, size, weight, base;
        if (sscanf(line, "table %lu %lu %lu %lx", &n, &size, &weight, &base) == 4) {
            uint64_t *t = mmap(0, n * words * 8, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (t == MAP_FAILED) return 3;
            for (unsigned long i = 0; i < n; i++) {
                uint64_t *r = t + i * words;
                r[seq] = 2;
                r[ptr] = base + i * 4096;
                r[size_w] = size;
                r[weight_w] = weight;
                r[time_w] = 1; /* long before any attach */
                r[flags_w] = live;
                r[nframes_w] = frames;
                /* A stack of its own per record. */
                for (unsigned long k = 0; k < frames; k++)
                    r[frames_w + k] = 0x10000000ul + i * 0x1000 + k * 8;
            }
            int len = snprintf(line, sizeof line, "table %lx\n", (unsigned long)t);
            if (write(1, line, len) != len) return 4;
        } else if (!strncmp(line, "exit", 4)) {
            return 0;
        }
    }
    return 0;
}
