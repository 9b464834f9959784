//! `liballocprof.so`: LD_PRELOAD sampling allocator over a statically linked
//! mimalloc. See `preload-glibc` for the glibc pass-through variant.

use core::ffi::c_void;

use allocator::backend::Backend;

unsafe extern "C" {
    // Not in libmimalloc-sys's default bindings but always compiled in.
    fn mi_calloc(n: usize, size: usize) -> *mut c_void;
    fn mi_usable_size(p: *const c_void) -> usize;
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
    unsafe fn usable_size(p: *mut c_void) -> usize {
        // SAFETY: p came from mimalloc.
        unsafe { mi_usable_size(p) }
    }
}

allocator::export_c_allocator!(Mimalloc);
