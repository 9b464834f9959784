/* Appended to the mimalloc unity build of liballocprof.so (see build.rs).
 *
 * C `free` must not change errno, and a successful allocation must not
 * either. mimalloc changes errno only through the OS primitives it calls on
 * its slow paths (mmap, munmap, madvise, mprotect, prctl naming an arena,
 * reading /proc and /sys, getrandom, ...): its fast paths (a free-list pop
 * or push) make no call at all. So instead of saving and restoring errno
 * around every malloc and free (a call frame, a TLS load and a store per
 * call: what made liballocprof.so ~1.4x slower than mimalloc itself on
 * small-block churn), every `_mi_prim_*` primitive runs with errno saved and
 * restored here. mimalloc itself still sees the errno of a failed syscall
 * (the primitives return it as their result, read inside the renamed
 * original). The `_mi_prim_*` definitions of prim/prim.c are renamed to
 * `allocprof_raw_*` by build.rs, which also checks that this file wraps
 * exactly the primitives mimalloc's prim.h declares.
 *
 * Failure: a failing allocation reaches `_mi_malloc_generic` (renamed the
 * same way), which sets ENOMEM when it returns NULL, as C requires. It is
 * kept out of line so that mimalloc's fast paths still end in a tail jump
 * to it, as they do without this file. */

#include <errno.h>

#define ALLOCPROF_KEEP_ERRNO(call) \
  do { const int allocprof_saved = errno; call; errno = allocprof_saved; } while (0)

#define ALLOCPROF_WRAP(ret, name, params, args) \
  ret name params { ret r; ALLOCPROF_KEEP_ERRNO(r = allocprof_raw_##name args); return r; }
#define ALLOCPROF_WRAP_VOID(name, params, args) \
  void name params { ALLOCPROF_KEEP_ERRNO(allocprof_raw_##name args); }

ALLOCPROF_WRAP_VOID(_mi_prim_mem_init, (mi_os_mem_config_t* config), (config))
/* The memory mimalloc maps from the system, announced as the
 * otel_memory:mmap / munmap probes (preload/src/lib.rs, `os_probes`):
 * hidden, so they stay out of the library's exports. */
__attribute__((visibility("hidden"))) void allocprof_os_mapped(void* addr, size_t size);
__attribute__((visibility("hidden"))) void allocprof_os_unmapped(void* addr, size_t size);

int _mi_prim_free(void* addr, size_t size) {
  int r;
  ALLOCPROF_KEEP_ERRNO(r = allocprof_raw__mi_prim_free(addr, size));
  if (r == 0 && addr != NULL && size > 0) allocprof_os_unmapped(addr, size);
  return r;
}
int _mi_prim_alloc(void* hint_addr, size_t size, size_t try_alignment, bool commit, bool allow_large,
                   bool* is_large, bool* is_zero, void** addr) {
  int r;
  ALLOCPROF_KEEP_ERRNO(r = allocprof_raw__mi_prim_alloc(hint_addr, size, try_alignment, commit,
                                                        allow_large, is_large, is_zero, addr));
  if (r == 0 && *addr != NULL) allocprof_os_mapped(*addr, size);
  return r;
}
ALLOCPROF_WRAP(int, _mi_prim_commit, (void* addr, size_t size, bool* is_zero), (addr, size, is_zero))
ALLOCPROF_WRAP(int, _mi_prim_decommit, (void* addr, size_t size, bool* needs_recommit),
               (addr, size, needs_recommit))
ALLOCPROF_WRAP(int, _mi_prim_reset, (void* addr, size_t size), (addr, size))
ALLOCPROF_WRAP(int, _mi_prim_reuse, (void* addr, size_t size), (addr, size))
ALLOCPROF_WRAP(int, _mi_prim_protect, (void* addr, size_t size, bool protect), (addr, size, protect))
int _mi_prim_alloc_huge_os_pages(void* hint_addr, size_t size, int numa_node, bool* is_zero,
                                 void** addr) {
  int r;
  ALLOCPROF_KEEP_ERRNO(r = allocprof_raw__mi_prim_alloc_huge_os_pages(hint_addr, size, numa_node,
                                                                      is_zero, addr));
  if (r == 0 && *addr != NULL) allocprof_os_mapped(*addr, size);
  return r;
}
ALLOCPROF_WRAP(size_t, _mi_prim_numa_node, (void), ())
ALLOCPROF_WRAP(size_t, _mi_prim_numa_node_count, (void), ())
ALLOCPROF_WRAP(mi_msecs_t, _mi_prim_clock_now, (void), ())
ALLOCPROF_WRAP_VOID(_mi_prim_process_info, (mi_process_info_t* pinfo), (pinfo))
ALLOCPROF_WRAP_VOID(_mi_prim_out_stderr, (const char* msg), (msg))
ALLOCPROF_WRAP(bool, _mi_prim_getenv, (const char* name, char* result, size_t result_size),
               (name, result, result_size))
ALLOCPROF_WRAP(bool, _mi_prim_random_buf, (void* buf, size_t buf_len), (buf, buf_len))
ALLOCPROF_WRAP_VOID(_mi_prim_thread_init_auto_done, (void), ())
ALLOCPROF_WRAP_VOID(_mi_prim_thread_done_auto_done, (void), ())
ALLOCPROF_WRAP_VOID(_mi_prim_thread_associate_default_heap, (mi_heap_t* heap), (heap))

/* Every allocation that is not a free-list pop goes through here; NULL is
 * a failure to allocate (too large, or the OS refused memory). */
mi_decl_noinline void* _mi_malloc_generic(mi_heap_t* heap, size_t size, bool zero, size_t huge_alignment,
                         size_t* usable) mi_attr_noexcept {
  void* p = allocprof_raw__mi_malloc_generic(heap, size, zero, huge_alignment, usable);
  if (mi_unlikely(p == NULL)) errno = ENOMEM;
  return p;
}

/* Hidden aliases for liballocprof.so's assembly malloc/free entries, which
 * jump to them directly (mimalloc's own symbols have default visibility in
 * the object; the library's version script hides them only at the link). */
extern __typeof(mi_malloc) allocprof_mi_malloc
    __attribute__((alias("mi_malloc"), visibility("hidden")));
extern __typeof(mi_free) allocprof_mi_free
    __attribute__((alias("mi_free"), visibility("hidden")));
