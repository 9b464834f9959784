//! The C `malloc` family with glibc semantics, generic over the [`Backend`]
//! that serves unsampled allocations. `export_c_allocator!` turns these into
//! `#[no_mangle]` symbols in an LD_PRELOAD library; nothing here is exported
//! by the rlib itself.
//!
//! Fast paths: allocation = countdown + branch + backend call; free = range
//! compare + backend call. Everything else is `#[cold]`. The exported
//! `malloc` and `free` are written in assembly (`export_c_allocator!`):
//! four and six instructions ending in a tail jump to the backend, with no
//! frame, so that the layer costs next to nothing over the backend itself.
//!
//! (Over 600 lines on purpose: every C entry point side by side, so their
//! glibc semantics, errno, alignment and realloc rules, read as one.)

use core::ffi::c_void;
use core::ptr;

use crate::backend::Backend;
use crate::sample_region::{self, PAGE};
use crate::sampler::BIG_BLOCK;
use crate::{backend_stats, sampled, thread_state};

/// glibc's MALLOC_ALIGNMENT on x86_64.
pub const MIN_ALIGN: usize = 16;

#[inline(always)]
fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

#[inline(always)]
fn in_region(p: *mut c_void) -> bool {
    sample_region::contains(p as *const u8)
}

/// # Safety
/// C `malloc`.
#[inline(always)]
pub unsafe fn malloc<B: Backend>(size: usize) -> *mut c_void {
    if thread_state::countdown(size) {
        // SAFETY: same contract.
        return unsafe { alloc_slow::<B>(size, MIN_ALIGN, false) };
    }
    // SAFETY: same contract.
    unsafe { B::malloc(size) }
}

/// # Safety
/// C `calloc`.
#[inline(always)]
pub unsafe fn calloc<B: Backend>(n: usize, m: usize) -> *mut c_void {
    let Some(size) = n.checked_mul(m) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    if thread_state::countdown(size) {
        // SAFETY: same contract.
        return unsafe { alloc_slow::<B>(size, MIN_ALIGN, true) };
    }
    // SAFETY: same contract.
    unsafe { B::calloc(size) }
}

/// # Safety
/// C `free`.
#[inline(always)]
pub unsafe fn free<B: Backend>(p: *mut c_void) {
    if in_region(p) {
        release_sampled::<B>(p);
        return;
    }
    // SAFETY: p is null or came from the backend.
    unsafe { B::free(p) }
}

/// # Safety
/// C `realloc` (glibc: `realloc(p, 0)` frees `p` and returns null).
#[inline(always)]
pub unsafe fn realloc<B: Backend>(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: same contract.
        return unsafe { malloc::<B>(size) };
    }
    if size == 0 {
        // SAFETY: same contract.
        unsafe { free::<B>(p) };
        return ptr::null_mut();
    }
    let expired = thread_state::countdown(size);
    if !expired && !in_region(p) {
        // SAFETY: p came from the backend.
        return unsafe { B::realloc(p, size) };
    }
    // SAFETY: same contract.
    unsafe { realloc_slow::<B>(p, size, expired) }
}

/// # Safety
/// glibc `reallocarray`.
pub unsafe fn reallocarray<B: Backend>(p: *mut c_void, n: usize, m: usize) -> *mut c_void {
    match n.checked_mul(m) {
        // SAFETY: same contract.
        Some(size) => unsafe { realloc::<B>(p, size) },
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// glibc `memalign`/`aligned_alloc` (2.36): alignment below 16 is raised,
/// a non-power of two is rounded up, absurd ones fail with EINVAL.
///
/// # Safety
/// C `memalign`.
pub unsafe fn memalign<B: Backend>(align: usize, size: usize) -> *mut c_void {
    if align > usize::MAX / 2 + 1 {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    let align = align.max(MIN_ALIGN).next_power_of_two();
    if thread_state::countdown(size) {
        // SAFETY: same contract.
        return unsafe { alloc_slow::<B>(size, align, false) };
    }
    // SAFETY: align is a power of two >= 16.
    unsafe { B::memalign(align, size) }
}

/// # Safety
/// POSIX `posix_memalign`; errno is left untouched.
pub unsafe fn posix_memalign<B: Backend>(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if align < size_of::<*mut c_void>() || !align.is_power_of_two() {
        return libc::EINVAL;
    }
    // SAFETY: __errno_location returns this thread's errno slot.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: same contract.
    let p = unsafe { memalign::<B>(align, size) };
    set_errno(saved);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable `out`.
    unsafe { *out = p };
    0
}

/// # Safety
/// C `valloc`.
pub unsafe fn valloc<B: Backend>(size: usize) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { memalign::<B>(PAGE, size) }
}

/// # Safety
/// glibc `pvalloc`: size rounded up to whole pages.
pub unsafe fn pvalloc<B: Backend>(size: usize) -> *mut c_void {
    let Some(rounded) = size.checked_next_multiple_of(PAGE) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    // SAFETY: same contract.
    unsafe { memalign::<B>(PAGE, rounded) }
}

/// # Safety
/// glibc `malloc_usable_size`.
pub unsafe fn malloc_usable_size<B: Backend>(p: *mut c_void) -> usize {
    if p.is_null() {
        0
    } else if in_region(p) {
        sample_region::usable_size(p.cast())
    } else {
        // SAFETY: p came from the backend.
        unsafe { B::usable_size(p) }
    }
}

/// A block in the sample region is freed (from `free` and the C entry
/// points that free): a sample, or a big unsampled block.
#[cold]
#[inline(never)]
fn release_sampled<B: Backend>(p: *mut c_void) {
    if sampled::release(p.cast()) {
        backend_stats::refresh::<B>();
    }
}

/// The rest of `malloc` once its assembly entry (`export_c_allocator!`)
/// found the countdown expired (the size is already subtracted).
///
/// # Safety
/// C `malloc`.
#[doc(hidden)]
pub unsafe extern "C" fn malloc_expired<B: Backend>(size: usize) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { alloc_slow::<B>(size, MIN_ALIGN, false) }
}

/// `free` of a pointer in the sample region, from the assembly entry of
/// `export_c_allocator!`.
///
/// # Safety
/// C `free`.
#[doc(hidden)]
pub unsafe extern "C" fn free_sampled<B: Backend>(p: *mut c_void) {
    release_sampled::<B>(p);
}

/// Countdown expired on an allocation: sample it (if the sampler says so)
/// or fall back to the backend. A sample the region cannot take is served
/// by the backend and announced with a null pointer, so its weight is
/// counted as dropped rather than lost. Every big block (`BIG_BLOCK` and
/// up) comes here; an unsampled one takes a warm slot of the region if
/// there is one ([`unsampled_big`]).
#[cold]
#[inline(never)]
unsafe fn alloc_slow<B: Backend>(size: usize, align: usize, zero: bool) -> *mut c_void {
    let weight = thread_state::resolve(size);
    if weight != 0 {
        // The region zeroes only when it reuses a warm slot.
        let p = sampled::place(size, align, weight, zero);
        backend_stats::refresh::<B>();
        if !p.is_null() {
            return p.cast();
        }
    } else if let Some(p) = unsampled_big(size, align, zero) {
        return p;
    }
    // SAFETY: forwarded with the caller's contract; align is a power of two.
    let p = unsafe {
        if align > MIN_ALIGN {
            B::memalign(align, size)
        } else if zero {
            B::calloc(size)
        } else {
            B::malloc(size)
        }
    };
    sampled::served_by_backend(p, size, weight)
}

/// An unsampled block of `size` bytes in a warm slot of the sample region
/// (`sample_region::alloc_unsampled`), for big blocks only: the smaller
/// ones' slow paths (a countdown that ran out short of a sample) keep to
/// the backend.
#[inline(always)]
fn unsampled_big(size: usize, align: usize, zero: bool) -> Option<*mut c_void> {
    if size < BIG_BLOCK {
        return None;
    }
    sample_region::alloc_unsampled(size, align, zero).map(|p| p.cast())
}

/// realloc where the old block is in the region or the new size's
/// countdown expired: the block is re-sampled on its new size, moving
/// between the region and the backend as needed (an unsampled block that
/// leaves the region may take a warm slot there again, as in `malloc`).
/// On failure the old block is intact.
#[cold]
#[inline(never)]
unsafe fn realloc_slow<B: Backend>(p: *mut c_void, size: usize, expired: bool) -> *mut c_void {
    let weight = if expired {
        thread_state::resolve(size)
    } else {
        0
    };
    let old_in_region = in_region(p);
    let q = if weight != 0 {
        let q = sampled::place(size, MIN_ALIGN, weight, false).cast::<c_void>();
        backend_stats::refresh::<B>();
        q
    } else {
        ptr::null_mut()
    };
    let q = if !q.is_null() {
        q
    } else if old_in_region {
        let warm = if weight == 0 {
            unsampled_big(size, MIN_ALIGN, false)
        } else {
            None // a sample the region could not take: announced below
        };
        let q = match warm {
            Some(q) => q,
            // SAFETY: plain backend allocation.
            None => sampled::served_by_backend(unsafe { B::malloc(size) }, size, weight),
        };
        if q.is_null() {
            return ptr::null_mut();
        }
        q
    } else {
        // Unsampled to unsampled: the backend may resize in place.
        // SAFETY: p came from the backend.
        return sampled::served_by_backend(unsafe { B::realloc(p, size) }, size, weight);
    };
    // SAFETY: p and q are distinct live blocks; p has at least `old` usable
    // bytes and q at least `size`.
    unsafe {
        let old = malloc_usable_size::<B>(p);
        ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size));
        free::<B>(p);
    }
    q
}

/// Define the exported C allocator symbols in the invoking crate (an
/// LD_PRELOAD cdylib), backed by `$backend: allocator::backend::Backend`.
/// `malloc = f, free = g` name the C functions that `$backend`'s own
/// `malloc` and `free` call (extern "C" items in scope): the assembly
/// entries of `malloc` and `free` tail-jump to them, through the GOT for
/// functions of another library, directly for functions of this one
/// (`local malloc = f, local free = g`: hidden symbols; rustc's
/// GOT-indirect jumps are not relaxed by the linker), or through a static
/// holding the function's address (`indirect malloc = S, indirect free =
/// T`: glibc's, found at run time, see `backend::resolve_glibc`).
///
/// Besides the standard names, the library exports glibc's own entry
/// points (`__libc_malloc`, `__libc_free`, `__libc_calloc`,
/// `__libc_realloc`, `__libc_memalign`, `__libc_valloc`, `__libc_pvalloc`:
/// every `__libc_*` allocation function glibc exports at a public version),
/// as mimalloc's, jemalloc's and tcmalloc's overrides do: code that calls
/// them (glibc's `libc_malloc_debug.so`, programs that wrap malloc) must get
/// blocks the exported `free` accepts, and the other way round.
///
/// Why assembly: in Rust the entries are the same logic (`capi::malloc`,
/// `capi::free`), but rustc gives every function a frame pointer here
/// (`-C force-frame-pointers=yes`) and calls other crates' and C functions
/// GOT-indirect; that was a third of the layer's remaining cost on small
/// blocks. The probe sites are in the `#[cold]` slow paths, which keep
/// their frames, so stack walks from a probe are unaffected.
#[macro_export]
macro_rules! export_c_allocator {
    ($backend:ty, malloc = $fast_malloc:path, free = $fast_free:path $(,)?) => {
        $crate::export_c_allocator!(
            @entries $backend,
            "jmp qword ptr [rip + {fast}@GOTPCREL]",
            $fast_malloc,
            $fast_free
        );
    };
    ($backend:ty, local malloc = $fast_malloc:path, local free = $fast_free:path $(,)?) => {
        $crate::export_c_allocator!(@entries $backend, "jmp {fast}", $fast_malloc, $fast_free);
    };
    ($backend:ty, indirect malloc = $fast_malloc:path, indirect free = $fast_free:path $(,)?) => {
        $crate::export_c_allocator!(
            @entries $backend,
            "jmp qword ptr [rip + {fast}]",
            $fast_malloc,
            $fast_free
        );
    };
    (@entries $backend:ty, $jump:literal, $fast_malloc:path, $fast_free:path) => {
        use ::core::ffi::c_void as __AllocprofVoid;

        /// C `malloc`: `capi::malloc` (countdown; expired → the slow path,
        /// else the backend) as a frameless tail jump.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn malloc(size: usize) -> *mut __AllocprofVoid {
            // The countdown is the i64 at offset 0 of this thread's
            // `__allocprof_thread_state` (allocator/src/thread_state.rs
            // asserts it), reached initial-exec: TLS offset from the GOT,
            // then %fs-relative. `sub` + `js` = `countdown(size)`.
            ::core::arch::naked_asm!(
                ".cfi_startproc",
                "mov rax, qword ptr [rip + __allocprof_thread_state@GOTTPOFF]",
                "sub qword ptr fs:[rax], rdi",
                "js 2f",
                $jump,
                "2:",
                "jmp {slow}",
                ".cfi_endproc",
                fast = sym $fast_malloc,
                slow = sym $crate::capi::malloc_expired::<$backend>,
            )
        }

        /// C `free`: `capi::free` (one range compare against the sample
        /// region, `sample_region::contains`; inside → the sampled path,
        /// else the backend) as a frameless tail jump.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn free(p: *mut __AllocprofVoid) {
            ::core::arch::naked_asm!(
                ".cfi_startproc",
                "mov rax, rdi",
                "sub rax, qword ptr [rip + {bounds}]",
                "cmp rax, qword ptr [rip + {bounds} + 8]",
                "jb 2f",
                $jump,
                "2:",
                "jmp {slow}",
                ".cfi_endproc",
                bounds = sym $crate::sample_region::BOUNDS,
                fast = sym $fast_free,
                slow = sym $crate::capi::free_sampled::<$backend>,
            )
        }

        /// C23 `free_sized`: the size hint is not needed (sampled blocks
        /// are recognised by address), so it is `free`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn free_sized(p: *mut __AllocprofVoid, _size: usize) {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::free::<$backend>(p) }
        }

        /// C23 `free_aligned_sized`: `free`, as above.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn free_aligned_sized(
            p: *mut __AllocprofVoid,
            _align: usize,
            _size: usize,
        ) {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::free::<$backend>(p) }
        }

        /// Obsolete alias of `free`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn cfree(p: *mut __AllocprofVoid) {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::free::<$backend>(p) }
        }

        /// C `calloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn calloc(n: usize, m: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::calloc::<$backend>(n, m) }
        }

        /// C `realloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn realloc(
            p: *mut __AllocprofVoid,
            size: usize,
        ) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::realloc::<$backend>(p, size) }
        }

        /// glibc `reallocarray`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn reallocarray(
            p: *mut __AllocprofVoid,
            n: usize,
            m: usize,
        ) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::reallocarray::<$backend>(p, n, m) }
        }

        /// POSIX `posix_memalign`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn posix_memalign(
            out: *mut *mut __AllocprofVoid,
            align: usize,
            size: usize,
        ) -> i32 {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::posix_memalign::<$backend>(out, align, size) }
        }

        /// C11 `aligned_alloc` (glibc 2.36 semantics = memalign).
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::memalign::<$backend>(align, size) }
        }

        /// glibc `memalign`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::memalign::<$backend>(align, size) }
        }

        /// `valloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn valloc(size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::valloc::<$backend>(size) }
        }

        /// glibc `pvalloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn pvalloc(size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::pvalloc::<$backend>(size) }
        }

        /// glibc `malloc_usable_size`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn malloc_usable_size(p: *mut __AllocprofVoid) -> usize {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::malloc_usable_size::<$backend>(p) }
        }

        /// glibc's `__libc_malloc`: `malloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_malloc(size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::malloc::<$backend>(size) }
        }

        /// glibc's `__libc_free`: `free`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_free(p: *mut __AllocprofVoid) {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::free::<$backend>(p) }
        }

        /// glibc's `__libc_calloc`: `calloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_calloc(n: usize, m: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::calloc::<$backend>(n, m) }
        }

        /// glibc's `__libc_realloc`: `realloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_realloc(
            p: *mut __AllocprofVoid,
            size: usize,
        ) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::realloc::<$backend>(p, size) }
        }

        /// glibc's `__libc_memalign`: `memalign`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_memalign(
            align: usize,
            size: usize,
        ) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::memalign::<$backend>(align, size) }
        }

        /// glibc's `__libc_valloc`: `valloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_valloc(size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::valloc::<$backend>(size) }
        }

        /// glibc's `__libc_pvalloc`: `pvalloc`.
        ///
        /// # Safety
        /// C semantics.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn __libc_pvalloc(size: usize) -> *mut __AllocprofVoid {
            // SAFETY: C contract of the export.
            unsafe { $crate::capi::pvalloc::<$backend>(size) }
        }

        /// Sampling counters (for tests and the benchmark).
        ///
        /// # Safety
        /// `out` must be writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn allocprof_stats(out: *mut $crate::Stats) {
            // SAFETY: the caller passes a writable Stats.
            unsafe { *out = $crate::stats() };
        }
    };
}
