/* allocprof_probes.h: emit the heap-sampling probes (`otel_memory:alloc`,
 * `otel_memory:free`) the way allocprof, the OpenTelemetry eBPF profiler and
 * other consumers read them. The contract is docs/probe-contract.md.
 *
 * In exactly one C file of each executable or shared library:
 *
 *     #define ALLOCPROF_PROBES_IMPLEMENTATION
 *     #include "allocprof_probes.h"
 *
 * (and in the others, the plain #include). Then, from your allocator:
 *
 *     allocprof_probe_alloc(ptr, size, weight);  // a sampled block went live
 *     allocprof_probe_free(ptr);                 // a sampled block was freed
 *
 * - `weight` is the unbiased byte estimate of the sample: either
 *   `size / p` (p = the block's inclusion probability; per-byte sampling at
 *   mean interval R: p = 1 - exp(-size / R)) or `nsamples * R` (the number
 *   of sampling points the block's bytes crossed, times R). Use one form per
 *   process, and always the same R for `nsamples * R`.
 * - `ptr` is the block's address. 0 means "sampled, but its free will not be
 *   reported": counted in the allocated bytes, not in the live ones.
 * - Call `allocprof_probe_free` only for pointers you reported to
 *   `allocprof_probe_alloc` (a free of an unsampled pointer costs a probe hit
 *   and is counted as unmatched).
 *
 * Define ALLOCPROF_PROBES_PROVIDER (a string) before the implementation's
 * #include to emit another provider name, e.g. "ddheap".
 *
 * Each probe site is a 5-byte NOP (0f 1f 44 00 00): Linux optimizes a uprobe
 * on it into a jump (~0.7 us a hit instead of an int3 trap's ~12 us). The
 * probe functions are written in assembly, so whatever the compiler flags:
 * they are never inlined (one site per binary), they set up a frame before the
 * NOP (a frame-pointer walk then sees the caller), they have CFI (a table walk
 * does too), and the arguments are the SysV argument registers, as the notes
 * say (`8@%rdi 8@%rsi 8@%rdx`). x86-64 only. */
#ifndef ALLOCPROF_PROBES_H
#define ALLOCPROF_PROBES_H

#include <stddef.h>
#include <stdint.h>

#if !defined(__x86_64__)
#error "allocprof_probes.h supports x86-64 only"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Hidden: every executable or library that includes the implementation has
 * its own probe sites, and none interposes another's. */
__attribute__((visibility("hidden"))) void allocprof_probe_alloc(void *ptr, size_t size,
                                                                  uint64_t weight);
__attribute__((visibility("hidden"))) void allocprof_probe_free(void *ptr);

#ifdef __cplusplus
}
#endif

#ifdef ALLOCPROF_PROBES_IMPLEMENTATION

#ifndef ALLOCPROF_PROBES_PROVIDER
#define ALLOCPROF_PROBES_PROVIDER "otel_memory"
#endif

/* One probe function: push %rbp / mov %rsp,%rbp (the frame), the NOP site,
 * pop %rbp / ret. The note is SystemTap SDT v3, as <sys/sdt.h> writes it:
 * pc, the address of _.stapsdt.base, semaphore 0 (none), provider, name,
 * argument string. */
#define ALLOCPROF_PROBES_FN_(symbol, name, args)                                                  \
    ".pushsection .text\n"                                                                     \
    ".balign 16\n"                                                                             \
    ".globl " symbol "\n"                                                                      \
    ".hidden " symbol "\n"                                                                     \
    ".type " symbol ", @function\n" symbol ":\n"                                               \
    ".cfi_startproc\n"                                                                         \
    "push %rbp\n"                                                                              \
    ".cfi_def_cfa_offset 16\n"                                                                 \
    ".cfi_offset %rbp, -16\n"                                                                  \
    "mov %rsp, %rbp\n"                                                                         \
    ".cfi_def_cfa_register %rbp\n"                                                             \
    "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"                                                \
    "pop %rbp\n"                                                                               \
    ".cfi_def_cfa %rsp, 8\n"                                                                   \
    "ret\n"                                                                                    \
    ".cfi_endproc\n"                                                                           \
    ".size " symbol ", .-" symbol "\n"                                                         \
    ".pushsection .note.stapsdt,\"\",\"note\"\n"                                               \
    ".balign 4\n"                                                                              \
    ".4byte 992f-991f, 994f-993f, 3\n"                                                         \
    "991: .asciz \"stapsdt\"\n"                                                                \
    "992: .balign 4\n"                                                                         \
    "993: .8byte 990b\n"                                                                       \
    ".8byte _.stapsdt.base\n"                                                                  \
    ".8byte 0\n"                                                                               \
    ".asciz \"" ALLOCPROF_PROBES_PROVIDER "\"\n"                                               \
    ".asciz \"" name "\"\n"                                                                    \
    ".asciz \"" args "\"\n"                                                                    \
    "994: .balign 4\n"                                                                         \
    ".popsection\n"                                                                            \
    ".popsection\n"

__asm__(
    /* The anchor consumers use to detect prelink-style address shifts. */
    ".ifndef _.stapsdt.base\n"
    ".pushsection .stapsdt.base,\"aGR\",\"progbits\",.stapsdt.base,comdat\n"
    ".weak _.stapsdt.base\n"
    ".hidden _.stapsdt.base\n"
    "_.stapsdt.base: .space 1\n"
    ".size _.stapsdt.base, 1\n"
    ".popsection\n"
    ".endif\n"
    ALLOCPROF_PROBES_FN_("allocprof_probe_alloc", "alloc", "8@%rdi 8@%rsi 8@%rdx")
    ALLOCPROF_PROBES_FN_("allocprof_probe_free", "free", "8@%rdi"));

#endif /* ALLOCPROF_PROBES_IMPLEMENTATION */
#endif /* ALLOCPROF_PROBES_H */
