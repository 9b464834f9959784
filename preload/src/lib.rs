//! `liballocprof.so`: LD_PRELOAD sampling allocator over a statically linked
//! mimalloc. See `preload-glibc` for the glibc pass-through variant.
//!
//! mimalloc is compiled by build.rs from libmimalloc-sys's vendored source
//! (this crate never names libmimalloc-sys, so that crate's own copy is not
//! linked). Its slow paths keep errno as C requires (c/mimalloc_errno.c):
//! every OS primitive runs with errno saved and restored, and a failed
//! allocation sets ENOMEM. Its fast paths make no call. So `malloc` and
//! `free` need no errno work around mimalloc: they are C functions compiled
//! with mimalloc (c/entries.c) with its fast paths inlined after the
//! countdown and the range compare (exported under the names the Rust
//! entries of `export_c_allocator!` hold, see build.rs).

use core::ffi::c_void;

use core::sync::atomic::{AtomicI64, Ordering};

use allocator::backend::{Backend, Figures};
use profiler_common::backend_stats::{BACKEND_MIMALLOC, UNKNOWN};

// Hidden symbols of the mimalloc compiled by build.rs.
unsafe extern "C" {
    fn mi_malloc(size: usize) -> *mut c_void;
    fn mi_calloc(n: usize, size: usize) -> *mut c_void;
    fn mi_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn mi_free(p: *mut c_void);
    fn mi_malloc_aligned(size: usize, align: usize) -> *mut c_void;
    fn mi_usable_size(p: *const c_void) -> usize;
    // mimalloc's process-wide statistics (`mi_stats_t`, hidden in this
    // library). Its OS-level counters (reserved, committed) are kept in
    // release builds too, updated with atomic adds.
    static _mi_stats_main: [AtomicI64; MI_STATS_WORDS];
    // Hidden aliases of mi_malloc and mi_free (c/mimalloc_errno.c), so the
    // assembly entries jump to them directly: what `Mimalloc::malloc` and
    // `Mimalloc::free` call.
    fn allocprof_mi_malloc(size: usize) -> *mut c_void;
    fn allocprof_mi_free(p: *mut c_void);
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

/// ENOMEM on failure, for the entry points not on the hot path: mimalloc's
/// generic path already sets it (c/mimalloc_errno.c), but a few argument
/// checks (an aligned size above PTRDIFF_MAX) return NULL before it.
#[inline(always)]
fn enomem_on_null(p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
    }
    p
}

// SAFETY: mimalloc has C allocator semantics; with c/mimalloc_errno.c it
// leaves errno alone except for ENOMEM on a failed allocation (set here too
// where mimalloc might return NULL without its generic path).
unsafe impl Backend for Mimalloc {
    #[inline(always)]
    unsafe fn malloc(size: usize) -> *mut c_void {
        // Every NULL from mi_malloc comes from `_mi_malloc_generic`, which
        // sets ENOMEM: a tail call, nothing to do after it.
        // SAFETY: forwarded verbatim.
        unsafe { mi_malloc(size) }
    }
    #[inline(always)]
    unsafe fn calloc(size: usize) -> *mut c_void {
        // SAFETY: forwarded verbatim.
        enomem_on_null(unsafe { mi_calloc(1, size) })
    }
    #[inline(always)]
    unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: p came from mimalloc.
        enomem_on_null(unsafe { mi_realloc(p, size) })
    }
    #[inline(always)]
    unsafe fn free(p: *mut c_void) {
        // mi_free's syscalls (purging, unmapping) keep errno: see above.
        // SAFETY: p came from mimalloc (or is null).
        unsafe { mi_free(p) }
    }
    #[inline(always)]
    unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
        // SAFETY: align is a power of two.
        enomem_on_null(unsafe { mi_malloc_aligned(size, align) })
    }
    fn figures() -> Option<Figures> {
        mimalloc_figures()
    }
    unsafe fn usable_size(p: *mut c_void) -> usize {
        // SAFETY: p came from mimalloc.
        unsafe { mi_usable_size(p) }
    }
}

allocator::export_c_allocator!(
    Mimalloc,
    local malloc = allocprof_mi_malloc,
    local free = allocprof_mi_free,
);

// The slow halves of c/entries.c's `malloc` and `free` (which the library
// exports instead of the Rust entries above, see build.rs), under hidden
// fixed names: tail jumps to the generic Rust functions, on the slow paths
// only.
core::arch::global_asm!(
    ".pushsection .text.allocprof_entries_slow,\"ax\",@progbits",
    ".globl allocprof_malloc_expired",
    ".hidden allocprof_malloc_expired",
    ".type allocprof_malloc_expired,@function",
    "allocprof_malloc_expired:",
    ".cfi_startproc",
    "jmp {malloc_expired}",
    ".cfi_endproc",
    ".size allocprof_malloc_expired, . - allocprof_malloc_expired",
    ".globl allocprof_free_sampled",
    ".hidden allocprof_free_sampled",
    ".type allocprof_free_sampled,@function",
    "allocprof_free_sampled:",
    ".cfi_startproc",
    "jmp {free_sampled}",
    ".cfi_endproc",
    ".size allocprof_free_sampled, . - allocprof_free_sampled",
    ".popsection",
    malloc_expired = sym allocator::capi::malloc_expired::<Mimalloc>,
    free_sampled = sym allocator::capi::free_sampled::<Mimalloc>,
);

/// `otel_memory:mmap` and `otel_memory:munmap` for the memory mimalloc maps
/// from the system (its arenas and segments, every mapping: these are not
/// sampled), called by c/mimalloc_errno.c after `_mi_prim_alloc` and before
/// nothing else: mimalloc's OS layer is its slow path, never the fast one.
/// Two sites per probe, as `allocator::usdt`'s, for the same reason (a fork
/// child must not execute a site the kernel optimized in its parent).
mod os_probes {
    use allocator::usdt::fast_site_usable;

    // The fast sites' addresses (see allocator::usdt).
    unsafe extern "C" {
        static allocprof_usdt_mmap_fast_site: *const u8;
        static allocprof_usdt_munmap_fast_site: *const u8;
    }

    /// mimalloc mapped `size` bytes at `addr`.
    #[unsafe(no_mangle)]
    pub extern "C" fn allocprof_os_mapped(addr: usize, size: usize) {
        // SAFETY: a pointer the linker initialised, never written.
        let site = unsafe { allocprof_usdt_mmap_fast_site };
        if fast_site_usable(site, 2) {
            mmap_fast(addr, size)
        } else {
            mmap_trap(addr, size)
        }
    }

    /// mimalloc unmapped `size` bytes at `addr`.
    #[unsafe(no_mangle)]
    pub extern "C" fn allocprof_os_unmapped(addr: usize, size: usize) {
        // SAFETY: a pointer the linker initialised, never written.
        let site = unsafe { allocprof_usdt_munmap_fast_site };
        if fast_site_usable(site, 3) {
            munmap_fast(addr, size)
        } else {
            munmap_trap(addr, size)
        }
    }

    #[allow(named_asm_labels)]
    #[inline(never)]
    fn mmap_fast(addr: usize, size: usize) {
        // SAFETY: a NOP plus assembler directives that only add data to
        // other sections; it reads two registers and touches neither
        // memory nor the stack nor flags.
        unsafe {
            allocator::usdt_probe!(
                "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n.pushsection .data.rel.ro.allocprof_usdt_mmap_fast_site,\"aw\"\n.balign 8\n.globl allocprof_usdt_mmap_fast_site\n.hidden allocprof_usdt_mmap_fast_site\nallocprof_usdt_mmap_fast_site: .8byte 990b\n.popsection",
                "otel_memory", "mmap", "8@%rdi 8@%rsi",
                in("rdi") addr, in("rsi") size,
                options(nomem, nostack, preserves_flags)
            );
        }
    }

    #[inline(never)]
    fn mmap_trap(addr: usize, size: usize) {
        // SAFETY: as in `mmap_fast`.
        unsafe {
            allocator::usdt_probe!(
                "990: nop",
                "otel_memory", "mmap", "8@%rdi 8@%rsi",
                in("rdi") addr, in("rsi") size,
                options(nomem, nostack, preserves_flags)
            );
        }
    }

    #[allow(named_asm_labels)]
    #[inline(never)]
    fn munmap_fast(addr: usize, size: usize) {
        // SAFETY: as in `mmap_fast`.
        unsafe {
            allocator::usdt_probe!(
                "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n.pushsection .data.rel.ro.allocprof_usdt_munmap_fast_site,\"aw\"\n.balign 8\n.globl allocprof_usdt_munmap_fast_site\n.hidden allocprof_usdt_munmap_fast_site\nallocprof_usdt_munmap_fast_site: .8byte 990b\n.popsection",
                "otel_memory", "munmap", "8@%rdi 8@%rsi",
                in("rdi") addr, in("rsi") size,
                options(nomem, nostack, preserves_flags)
            );
        }
    }

    #[inline(never)]
    fn munmap_trap(addr: usize, size: usize) {
        // SAFETY: as in `mmap_fast`.
        unsafe {
            allocator::usdt_probe!(
                "990: nop",
                "otel_memory", "munmap", "8@%rdi 8@%rsi",
                in("rdi") addr, in("rsi") size,
                options(nomem, nostack, preserves_flags)
            );
        }
    }
}
