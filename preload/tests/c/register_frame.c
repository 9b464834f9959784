/* register_frame: what a JIT does. It registers unwind info with libgcc's
 * __register_frame (here, its own .eh_frame again), then unwinds through
 * it: libgcc 12's _Unwind_Find_FDE sorts the new object's FDEs with malloc
 * while it holds its object_mutex. A sampled malloc there must not call
 * back into libgcc's unwinder (which would take that mutex again on the
 * same thread: a hang). Repeats register, backtrace, deregister
 * REGISTER_ROUNDS times (200 by default); prints "frames N sampled S" with
 * the last backtrace's depth and the library's sample count. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unwind.h>

extern void __register_frame(void *);
extern void __deregister_frame(void *);

struct stats {
    unsigned long sampled, unplaced, freed, live_pages;
};

static const unsigned char *eh_frame_hdr;

static int find_hdr(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    (void)arg;
    /* The first object is the executable. */
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME)
            eh_frame_hdr = (const unsigned char *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    return 1;
}

/* .eh_frame's start, from .eh_frame_hdr's eh_frame_ptr (pcrel sdata4). */
static void *own_eh_frame(void) {
    dl_iterate_phdr(find_hdr, NULL);
    if (!eh_frame_hdr || eh_frame_hdr[0] != 1 || eh_frame_hdr[1] != 0x1b) {
        fprintf(stderr, "no usable .eh_frame_hdr\n");
        exit(2);
    }
    int32_t off;
    memcpy(&off, eh_frame_hdr + 4, 4);
    return (void *)(eh_frame_hdr + 4 + off);
}

static _Unwind_Reason_Code count(struct _Unwind_Context *ctx, void *arg) {
    (void)ctx;
    ++*(int *)arg;
    return _URC_NO_REASON;
}

__attribute__((noinline)) static int backtrace_depth(void) {
    int n = 0;
    _Unwind_Backtrace(count, &n);
    return n;
}

int main(void) {
    const char *r = getenv("REGISTER_ROUNDS");
    int rounds = r ? atoi(r) : 200;
    void *eh = own_eh_frame();
    int frames = 0;
    for (int i = 0; i < rounds; i++) {
        __register_frame(eh);
        frames = backtrace_depth();
        __deregister_frame(eh);
        if (frames < 2) {
            fprintf(stderr, "round %d: backtrace of %d frames\n", i, frames);
            return 1;
        }
    }
    struct stats s = {0};
    void (*stats_fn)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (stats_fn) stats_fn(&s);
    printf("frames %d sampled %lu\n", frames, s.sampled);
    return 0;
}
