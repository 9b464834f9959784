//! Backends behind the C entry points (`capi`): the allocator that serves
//! unsampled allocations.

use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use profiler_common::backend_stats::{BACKEND_GLIBC, UNKNOWN};

pub use crate::backend_stats::Figures;

/// The glibc function in `$slot`, typed.
macro_rules! glibc_fn {
    ($slot:ident: fn($($arg:ty),*) $(-> $ret:ty)?) => {
        core::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
            $slot.load(Ordering::Acquire),
        )
    };
}

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
    /// [`crate::backend_stats`]); called on the sampling slow path, up to
    /// every millisecond. Must be cheap, take no lock (another thread may
    /// hold it for long, or this one already) and not call back into the
    /// `malloc` family: a figure that cannot be had so is `UNKNOWN`.
    fn figures() -> Option<Figures> {
        None
    }
}

/// glibc's own entry points, found at run time (see [`resolve_glibc`]).
/// Each starts as a stub that resolves them all, then calls through.
/// `GLIBC_MALLOC` and `GLIBC_FREE` are public for `export_c_allocator!`'s
/// assembly entries, which jump through them.
pub static GLIBC_MALLOC: AtomicPtr<c_void> = AtomicPtr::new(first_malloc as *mut c_void);
pub static GLIBC_FREE: AtomicPtr<c_void> = AtomicPtr::new(first_free as *mut c_void);
static GLIBC_CALLOC: AtomicPtr<c_void> = AtomicPtr::new(first_calloc as *mut c_void);
static GLIBC_REALLOC: AtomicPtr<c_void> = AtomicPtr::new(first_realloc as *mut c_void);
static GLIBC_MEMALIGN: AtomicPtr<c_void> = AtomicPtr::new(first_memalign as *mut c_void);

/// The thread resolving glibc's entry points (0: none), so that an
/// allocator call made by the resolution itself (dlvsym freeing an old
/// dlerror string) does not recurse.
static RESOLVING: AtomicI32 = AtomicI32::new(0);

/// Finds glibc's `__libc_malloc` & co. with `dlvsym(RTLD_NEXT, …,
/// "GLIBC_2.2.5")`. A link-time reference cannot do it: the library
/// exports `__libc_malloc` itself (code that calls glibc's entry points
/// directly must reach the sampling layer too), and the dynamic linker
/// binds every reference to that name, ours included, to the first
/// definition in the global scope: our own. `RTLD_NEXT` starts the search
/// after this library. Called by `liballocprof_glibc.so`'s constructor,
/// and by the first allocator call if one comes before it (the dynamic
/// linker's, a `.preinit_array` function's). False if this thread is
/// already resolving (the caller must not call glibc then). Aborts if
/// glibc lacks them (not glibc: nothing could serve the allocation).
#[cold]
#[inline(never)]
pub fn resolve_glibc() -> bool {
    crate::errno::preserving(|| {
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        let marked = match RESOLVING.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(t) if t == tid => return false,
            // Another thread is at it: resolving twice is harmless.
            Err(_) => false,
        };
        for (slot, name) in [
            (&GLIBC_FREE, c"__libc_free"),
            (&GLIBC_MALLOC, c"__libc_malloc"),
            (&GLIBC_CALLOC, c"__libc_calloc"),
            (&GLIBC_REALLOC, c"__libc_realloc"),
            (&GLIBC_MEMALIGN, c"__libc_memalign"),
        ] {
            // SAFETY: valid NUL-terminated strings; RTLD_NEXT is relative
            // to this function's object, the library.
            let f =
                unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), c"GLIBC_2.2.5".as_ptr()) };
            if f.is_null() {
                const MSG: &[u8] = b"allocprof: glibc's __libc_malloc family not found\n";
                // SAFETY: write(2) of a static buffer, then abort.
                unsafe {
                    libc::write(2, MSG.as_ptr().cast(), MSG.len());
                    libc::abort();
                }
            }
            slot.store(f, Ordering::Release);
        }
        if marked {
            RESOLVING.store(0, Ordering::Release);
        }
        true
    })
}

unsafe extern "C" fn first_malloc(size: usize) -> *mut c_void {
    if !resolve_glibc() {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    }
    // SAFETY: resolved: glibc's malloc.
    unsafe { Glibc::malloc(size) }
}

unsafe extern "C" fn first_free(p: *mut c_void) {
    // A block freed by the resolution itself is left alone (leaked).
    if resolve_glibc() {
        // SAFETY: resolved: glibc's free, of a glibc block.
        unsafe { Glibc::free(p) }
    }
}

unsafe extern "C" fn first_calloc(n: usize, size: usize) -> *mut c_void {
    if !resolve_glibc() {
        return core::ptr::null_mut();
    }
    // SAFETY: resolved: glibc's calloc.
    unsafe { glibc_fn!(GLIBC_CALLOC: fn(usize, usize) -> *mut c_void)(n, size) }
}

unsafe extern "C" fn first_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if !resolve_glibc() {
        return core::ptr::null_mut();
    }
    // SAFETY: resolved: glibc's realloc, of a glibc block.
    unsafe { Glibc::realloc(p, size) }
}

unsafe extern "C" fn first_memalign(align: usize, size: usize) -> *mut c_void {
    if !resolve_glibc() {
        return core::ptr::null_mut();
    }
    // SAFETY: resolved: glibc's memalign.
    unsafe { Glibc::memalign(align, size) }
}

/// glibc's ptmalloc through its `__libc_*` entry points (see
/// [`resolve_glibc`]).
pub struct Glibc;

// SAFETY: forwards to glibc's allocator, which has C semantics.
unsafe impl Backend for Glibc {
    #[inline(always)]
    unsafe fn malloc(size: usize) -> *mut c_void {
        // SAFETY: glibc's malloc (or the stub that finds it).
        unsafe { glibc_fn!(GLIBC_MALLOC: fn(usize) -> *mut c_void)(size) }
    }
    #[inline(always)]
    unsafe fn calloc(size: usize) -> *mut c_void {
        // SAFETY: as above.
        unsafe { glibc_fn!(GLIBC_CALLOC: fn(usize, usize) -> *mut c_void)(1, size) }
    }
    #[inline(always)]
    unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: p came from this backend.
        unsafe { glibc_fn!(GLIBC_REALLOC: fn(*mut c_void, usize) -> *mut c_void)(p, size) }
    }
    #[inline(always)]
    unsafe fn free(p: *mut c_void) {
        // glibc's free preserves errno itself (since 2.33).
        // SAFETY: p came from this backend (or is null).
        unsafe { glibc_fn!(GLIBC_FREE: fn(*mut c_void))(p) }
    }
    #[inline(always)]
    unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
        // SAFETY: as above.
        unsafe { glibc_fn!(GLIBC_MEMALIGN: fn(usize, usize) -> *mut c_void)(align, size) }
    }
    fn figures() -> Option<Figures> {
        // glibc exports no running totals: `mallinfo2`, `malloc_info` and
        // `malloc_stats` walk every free chunk under each arena's lock
        // (35-53 ms of CPU with a million free chunks, while the arena's
        // other threads wait), far too long for a sampled malloc and for
        // the program's other threads. So the figures are unknown; the
        // block still names the backend, so allocprof can say why.
        Some(Figures {
            backend: BACKEND_GLIBC,
            reserved: UNKNOWN,
            committed: UNKNOWN,
            in_use: UNKNOWN,
            free: UNKNOWN,
            mmapped: UNKNOWN,
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
