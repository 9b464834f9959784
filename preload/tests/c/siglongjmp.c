/* siglongjmp: a timer whose handler siglongjmps back to main whenever it
 * interrupts the preloaded library's code, i.e. malloc's or free's slow
 * path (run with ALLOCPROF_RATE=1: every allocation is sampled). Only
 * there: jumping out of glibc's own code (mallinfo2, say) would leave an
 * arena locked, whatever the allocator. After each jump one malloc must
 * still be sampled: a slow path abandoned by the jump must not leave the
 * thread marked busy for good. Makes JUMPS jumps (3000 by default);
 * prints "jumps N"; exits 1 at the first jump after which sampling
 * stopped, printing "stuck after jump N". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <setjmp.h>
#include <stdint.h>
#include <ucontext.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

struct stats {
    unsigned long sampled, unplaced, freed, live_pages;
};

static sigjmp_buf env;
static volatile sig_atomic_t armed;
/* The library's executable segment. */
static uintptr_t lib_lo, lib_hi, lib_symbol;

static int find_lib(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    (void)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && lo <= lib_symbol &&
            lib_symbol < lo + ph->p_memsz) {
            lib_lo = lo;
            lib_hi = lo + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

static void on_tick(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    uintptr_t pc = ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
    if (armed && lib_lo <= pc && pc < lib_hi) {
        armed = 0;
        siglongjmp(env, 1);
    }
}

int main(void) {
    const char *j = getenv("JUMPS");
    long want = j ? atol(j) : 3000;
    void (*stats_fn)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (!stats_fn) {
        fprintf(stderr, "allocprof_stats not found: run under the library\n");
        return 2;
    }
    lib_symbol = (uintptr_t)stats_fn;
    dl_iterate_phdr(find_lib, NULL);
    if (!lib_lo) {
        fprintf(stderr, "the library's text not found\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_tick;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &it, NULL);
    volatile long jumps = 0;
    volatile unsigned long spins = 0;
    if (sigsetjmp(env, 1)) {
        jumps++;
        struct stats before, after;
        stats_fn(&before);
        void *p = malloc(100);
        stats_fn(&after);
        free(p);
        if (after.sampled == before.sampled) {
            struct itimerval off = {{0, 0}, {0, 0}};
            setitimer(ITIMER_REAL, &off, NULL);
            printf("stuck after jump %ld\n", jumps);
            return 1;
        }
    }
    if (jumps < want) {
        armed = 1;
        for (;;) {
            char *p = malloc(64 + (spins & 63));
            if (p) p[0] = 1;
            free(p);
            spins++;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("jumps %ld\n", jumps);
    return 0;
}
