//! Backends behind the C entry points (`capi`): the allocator that serves
//! unsampled allocations.

use core::ffi::c_void;

use profiler_common::backend_stats::{BACKEND_GLIBC, UNKNOWN};

pub use crate::backend_stats::Figures;

/// A C-style allocator. Implementations must not call back into the
/// exported `malloc` family (that would recurse into us).
///
/// # Safety
/// Implementations must behave like their C counterparts: `malloc` returns
/// 16-byte aligned memory or null with errno = ENOMEM, `free` preserves
/// errno (glibc >= 2.33 semantics), `free`/`realloc`/`usable_size` accept
/// exactly the pointers this backend returned.
#[allow(clippy::missing_safety_doc)] // one contract for all: C semantics, see above
pub unsafe trait Backend {
    unsafe fn malloc(size: usize) -> *mut c_void;
    /// `size` = n * m, already checked for overflow by the caller.
    unsafe fn calloc(size: usize) -> *mut c_void;
    unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void;
    unsafe fn free(p: *mut c_void);
    /// `align` is a power of two >= 16.
    unsafe fn memalign(align: usize, size: usize) -> *mut c_void;
    unsafe fn usable_size(p: *mut c_void) -> usize;
    /// The backend's own figures, for the block allocprof reads (see
    /// [`crate::backend_stats`]); called on the sampling slow path, a few
    /// times a second at most. Must not call back into the `malloc` family.
    fn figures() -> Option<Figures> {
        None
    }
}

unsafe extern "C" {
    /// glibc's malloc (what [`Glibc`]'s `malloc` calls; public for
    /// `export_c_allocator!`'s assembly entry).
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    /// glibc's free (what [`Glibc`]'s `free` calls; see `__libc_malloc`).
    pub fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// glibc's ptmalloc through its `__libc_*` entry points, which (unlike the
/// plain names) are not interposed by our own exports. No dlsym.
pub struct Glibc;

// SAFETY: forwards to glibc's allocator, which has C semantics.
unsafe impl Backend for Glibc {
    #[inline(always)]
    unsafe fn malloc(size: usize) -> *mut c_void {
        // SAFETY: forwarded verbatim.
        unsafe { __libc_malloc(size) }
    }
    #[inline(always)]
    unsafe fn calloc(size: usize) -> *mut c_void {
        // SAFETY: forwarded verbatim.
        unsafe { __libc_calloc(1, size) }
    }
    #[inline(always)]
    unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: p came from this backend.
        unsafe { __libc_realloc(p, size) }
    }
    #[inline(always)]
    unsafe fn free(p: *mut c_void) {
        // glibc's free preserves errno itself (since 2.33).
        // SAFETY: p came from this backend (or is null).
        unsafe { __libc_free(p) }
    }
    #[inline(always)]
    unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
        // SAFETY: forwarded verbatim.
        unsafe { __libc_memalign(align, size) }
    }
    fn figures() -> Option<Figures> {
        // mallinfo2 takes each arena's lock in turn and calls no allocator
        // function; this thread holds none of those locks here (it is in
        // our malloc, not glibc's), so it cannot deadlock.
        // SAFETY: no preconditions (glibc >= 2.33).
        let m = unsafe { libc::mallinfo2() };
        let total = |a: usize, b: usize| (a as u64).saturating_add(b as u64);
        Some(Figures {
            backend: BACKEND_GLIBC,
            // Arenas (brk heap and mmapped heaps) plus chunks mmapped alone.
            reserved: total(m.arena, m.hblkhd),
            // ptmalloc does not tell committed from reserved.
            committed: UNKNOWN,
            in_use: total(m.uordblks, m.hblkhd),
            free: m.fordblks as u64,
            mmapped: m.hblkhd as u64,
        })
    }
    unsafe fn usable_size(p: *mut c_void) -> usize {
        // glibc exports no un-interposable malloc_usable_size, and calling
        // the plain name would bind to our own export. Read the chunk header
        // as glibc's musable() does (no memory tagging on x86_64): size
        // field just below the block, low bits are flags, IS_MMAPPED = 2.
        // SAFETY: p is a live glibc block, preceded by its chunk header.
        let field = unsafe { *(p as *const usize).sub(1) };
        let chunk = field & !7;
        if field & 2 != 0 {
            chunk - 16
        } else {
            chunk - 8
        }
    }
}
