/* liballocprof.so's `malloc` and `free`, appended to the mimalloc unity
 * build (see build.rs) so that mimalloc's own fast paths are inlined into
 * them: the sampling layer is then one subtraction and one branch in front
 * of mimalloc's malloc, and one range compare in front of its free, with
 * no call or jump between them and mimalloc.
 *
 * The library exports them as `malloc` and `free`: build.rs links with
 * `--defsym=malloc=allocprof_mimalloc_malloc` (and the same for free), which
 * points the symbols the Rust entries (`export_c_allocator!`) define and
 * rustc's version script exports at these functions instead. Their slow
 * halves are the Rust ones (`allocprof_malloc_expired`,
 * `allocprof_free_sampled`: hidden stubs in preload/src/lib.rs). */

#include <stdbool.h>
#include <stdint.h>

/* allocator/src/thread_state.rs: this thread's countdown is the i64 at
 * offset 0 of `__allocprof_thread_state` (a 128-byte `.tbss` object),
 * reached initial-exec like mimalloc's own `_mi_heap_default`. */
struct allocprof_thread_state {
  int64_t countdown;
  unsigned char rest[120];
};
extern __thread struct allocprof_thread_state __allocprof_thread_state
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* allocator/src/sample_region: `p - base < len` <=> p is in the sample
 * region. Written once when the region is created; read relaxed. */
struct allocprof_sample_bounds {
  uintptr_t base;
  uintptr_t len;
};
extern struct allocprof_sample_bounds __allocprof_sample_bounds
    __attribute__((visibility("hidden")));

/* The Rust slow halves: `capi::malloc_expired` (the size is already
 * subtracted) and `capi::free_sampled`. */
__attribute__((visibility("hidden"))) void* allocprof_malloc_expired(size_t size);
__attribute__((visibility("hidden"))) void allocprof_free_sampled(void* p);

/* C `malloc`: `capi::malloc`. The countdown arithmetic is unsigned, as in
 * Rust (`wrapping_sub`): a size of 2^63 or more wraps to a negative
 * countdown and takes the slow path, which fails it. Not hidden, so the
 * `--defsym` alias keeps the default visibility (rustc's version script
 * then keeps this name itself local). */
mi_decl_restrict void* allocprof_mimalloc_malloc(size_t size) mi_attr_noexcept {
  int64_t* const countdown = &__allocprof_thread_state.countdown;
  const int64_t left = (int64_t)((uint64_t)*countdown - size);
  *countdown = left;
  if mi_unlikely(left < 0) return allocprof_malloc_expired(size);
  return mi_heap_malloc(mi_prim_get_default_heap(), size);
}

/* C `free`: `capi::free`. mimalloc's `mi_free_ex` is static inline in
 * free.c, earlier in this translation unit. */
void allocprof_mimalloc_free(void* p) mi_attr_noexcept {
  /* `sub` and `cmp` with the bounds as memory operands (aligned 8-byte
   * loads, atomic on x86_64, like Rust's relaxed loads in
   * `sample_region::contains`): C's atomic loads would cost a register
   * load each. */
  uintptr_t off = (uintptr_t)p;
  bool in_region;
  __asm__("sub %[base], %[off]\n\tcmp %[len], %[off]"
          : [off] "+r"(off), "=@ccb"(in_region)
          : [base] "m"(__allocprof_sample_bounds.base), [len] "m"(__allocprof_sample_bounds.len));
  if mi_unlikely(in_region) {
    allocprof_free_sampled(p);
    return;
  }
  mi_free_ex(p, NULL);
}
