//! `liballocprof.so`: LD_PRELOAD sampling allocator over a statically linked
//! mimalloc. See `preload-glibc` for the glibc pass-through variant.

use core::ffi::c_void;

use core::sync::atomic::{AtomicI64, Ordering};

use allocator::backend::{Backend, Figures};
use profiler_common::backend_stats::{BACKEND_MIMALLOC, UNKNOWN};

unsafe extern "C" {
    // Not in libmimalloc-sys's default bindings but always compiled in.
    fn mi_calloc(n: usize, size: usize) -> *mut c_void;
    fn mi_usable_size(p: *const c_void) -> usize;
    // mimalloc's process-wide statistics (`mi_stats_t`, hidden in this
    // library). Its OS-level counters (reserved, committed) are kept in
    // release builds too, updated with atomic adds.
    static _mi_stats_main: [AtomicI64; MI_STATS_WORDS];
}

/// `mi_stats_t` (mimalloc-stats.h, MI_STAT_VERSION 4, libmimalloc-sys
/// 0.1.49) as words: `size`, `version`, then `mi_stat_count_t { total,
/// peak, current }` for pages, reserved, committed...; we read the first 11.
/// Its own `size` and `version` cannot vouch for the layout: mimalloc zeroes
/// the whole struct at process start (`mi_stats_reset`). A libmimalloc-sys
/// update must re-check these offsets (tests/resident.rs checks the figures
/// against a real heap).
const MI_STATS_WORDS: usize = 11;
const MI_RESERVED_CURRENT: usize = 2 + 3 + 2;
const MI_COMMITTED_CURRENT: usize = 2 + 3 + 3 + 2;

/// Reserved and committed bytes from mimalloc's statistics.
fn mimalloc_figures() -> Option<Figures> {
    // SAFETY: a static of the linked mimalloc, more than MI_STATS_WORDS
    // words long (`mi_stats_t` is 4 KiB), whose counters mimalloc updates
    // with atomic adds.
    let stats = unsafe { &_mi_stats_main };
    let current = |i: usize| u64::try_from(stats[i].load(Ordering::Relaxed)).unwrap_or(0);
    Some(Figures {
        backend: BACKEND_MIMALLOC,
        reserved: current(MI_RESERVED_CURRENT),
        committed: current(MI_COMMITTED_CURRENT),
        // The release build counts neither (MI_STAT = 0).
        in_use: UNKNOWN,
        free: UNKNOWN,
        mmapped: UNKNOWN,
    })
}

/// mimalloc (statically linked; its symbols stay private to this library).
pub struct Mimalloc;

/// Run a mimalloc allocation with C semantics for errno: unchanged on
/// success, ENOMEM on failure. mimalloc's slow paths make syscalls that
/// fail harmlessly and leave errno set even when the allocation succeeds
/// (naming a fresh arena with prctl gives EINVAL on kernels without
/// CONFIG_ANON_VMA_NAME).
#[inline(always)]
fn c_errno(f: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let p = allocator::errno::preserving_on_success(f);
    if p.is_null() {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
    }
    p
}

// SAFETY: mimalloc has C allocator semantics; errno is set on failure here
// in case a mimalloc build does not, and preserved across successful calls
// and free.
unsafe impl Backend for Mimalloc {
    #[inline(always)]
    unsafe fn malloc(size: usize) -> *mut c_void {
        // SAFETY: forwarded verbatim.
        c_errno(|| unsafe { libmimalloc_sys::mi_malloc(size) })
    }
    #[inline(always)]
    unsafe fn calloc(size: usize) -> *mut c_void {
        // SAFETY: forwarded verbatim.
        c_errno(|| unsafe { mi_calloc(1, size) })
    }
    #[inline(always)]
    unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: p came from mimalloc.
        c_errno(|| unsafe { libmimalloc_sys::mi_realloc(p, size) })
    }
    #[inline(always)]
    unsafe fn free(p: *mut c_void) {
        // mi_free may reach munmap/madvise (segment and page purging),
        // which set errno on failure; C free must not change errno.
        // SAFETY: p came from mimalloc (or is null).
        allocator::errno::preserving(|| unsafe { libmimalloc_sys::mi_free(p) })
    }
    #[inline(always)]
    unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
        // SAFETY: align is a power of two.
        c_errno(|| unsafe { libmimalloc_sys::mi_malloc_aligned(size, align) })
    }
    fn figures() -> Option<Figures> {
        mimalloc_figures()
    }
    unsafe fn usable_size(p: *mut c_void) -> usize {
        // SAFETY: p came from mimalloc.
        unsafe { mi_usable_size(p) }
    }
}

allocator::export_c_allocator!(Mimalloc);
