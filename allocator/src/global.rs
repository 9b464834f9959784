//! `SamplingAllocator`: the sampler as a Rust `#[global_allocator]` wrapper
//! around any `GlobalAlloc`. Exports no C symbol: only Rust allocations of
//! the program that installs it are sampled.
//!
//! Under `LD_PRELOAD=liballocprof*.so`, `SamplingAllocator<System>` stands
//! down: `System` allocates with the C `malloc` the library interposes, so
//! the library already samples every one of those allocations, and a
//! second layer would count them twice (two unbiased estimates of the same
//! bytes add up to twice the bytes). A constructor looks for the library
//! before `main`; the slow path reads its answer. Other inner allocators
//! (mimalloc, jemalloc crates) do not go through `malloc` and keep sampling.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::{sample_region, sampled, thread_state};

/// A `liballocprof*.so` interposes the C allocator in this process.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Before `main`: is a sampling preload library in the global scope? It
/// exports `allocprof_stats`, which nothing else does. (In the preload
/// library's own copy of this crate the answer is yes, and unused: the
/// library's C entry points never read it.)
#[used]
#[unsafe(link_section = ".init_array")]
static FIND_PRELOAD: extern "C" fn() = {
    extern "C" fn find_preload() {
        // SAFETY: dlsym with a valid NUL-terminated name; constructors run
        // under the loader's (recursive) lock, where dlsym is allowed.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"allocprof_stats".as_ptr()) };
        PRELOADED.store(!f.is_null(), Ordering::Relaxed);
    }
    find_preload
};

/// Whether `SamplingAllocator<A>` leaves sampling to the preload library:
/// one is loaded and `A` is `std::alloc::System`, whose allocations it
/// sees (this crate is `no_std`: the type is known by its name).
fn stands_down<A>() -> bool {
    PRELOADED.load(Ordering::Relaxed) && core::any::type_name::<A>() == "std::alloc::System"
}

/// This thread's countdown pushed ~2^63 bytes away: a layer that stands
/// down keeps its fast path and never takes the slow one again. (`size`
/// is subtracted as an i64: 2^63 wraps to adding it.)
#[cold]
fn disarm_countdown() {
    thread_state::countdown(1 << 63);
}

/// Wraps `A`, diverting sampled allocations to the sample region and
/// firing the `otel_memory` probes for them.
pub struct SamplingAllocator<A> {
    inner: A,
}

impl<A: GlobalAlloc> SamplingAllocator<A> {
    pub const fn new(inner: A) -> Self {
        SamplingAllocator { inner }
    }

    /// The wrapped allocator.
    pub const fn inner(&self) -> &A {
        &self.inner
    }

    /// True when this layer leaves sampling to `liballocprof*.so`, which
    /// is preloaded and sees every allocation of `A` (`System`): each
    /// allocation is then sampled once, by the library.
    pub fn defers_to_preload(&self) -> bool {
        stands_down::<A>()
    }

    /// The sample weight of an allocation whose countdown expired: 0 when
    /// the preload library samples it instead.
    #[inline(always)]
    fn weigh(size: usize) -> u64 {
        if stands_down::<A>() {
            disarm_countdown();
            return 0;
        }
        thread_state::resolve(size)
    }

    #[cold]
    #[inline(never)]
    unsafe fn alloc_slow(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let weight = Self::weigh(layout.size());
        if weight != 0 {
            let p = sampled::place(layout.size(), layout.align(), weight, zeroed);
            if !p.is_null() {
                return p;
            }
        }
        // SAFETY: caller's GlobalAlloc contract (non-zero size layout).
        let p = unsafe {
            if zeroed {
                self.inner.alloc_zeroed(layout)
            } else {
                self.inner.alloc(layout)
            }
        };
        sampled::served_by_backend(p, layout.size(), weight)
    }

    #[cold]
    #[inline(never)]
    unsafe fn realloc_slow(
        &self,
        p: *mut u8,
        layout: Layout,
        new_size: usize,
        expired: bool,
    ) -> *mut u8 {
        let weight = if expired { Self::weigh(new_size) } else { 0 };
        let old_sampled = sample_region::contains(p);
        // SAFETY: GlobalAlloc::realloc guarantees this layout is valid.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let mut q = if weight != 0 {
            sampled::place(new_size, layout.align(), weight, false)
        } else {
            ptr::null_mut()
        };
        if q.is_null() {
            let served = if old_sampled {
                // SAFETY: valid non-zero layout.
                unsafe { self.inner.alloc(new_layout) }
            } else {
                // SAFETY: p came from inner with `layout`.
                unsafe { self.inner.realloc(p, layout, new_size) }
            };
            q = sampled::served_by_backend(served, new_size, weight);
            if q.is_null() || !old_sampled {
                return q;
            }
        }
        // SAFETY: p (layout.size() bytes) and q (new_size bytes) are
        // distinct live blocks.
        unsafe {
            ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
            self.dealloc(p, layout);
        }
        q
    }
}

// SAFETY: every block is either the inner allocator's (and handed back to
// it) or a region block satisfying the layout (slots are aligned to their
// size class, the class is chosen by size and alignment).
unsafe impl<A: GlobalAlloc> GlobalAlloc for SamplingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if thread_state::countdown(layout.size()) {
            // SAFETY: same contract.
            return unsafe { self.alloc_slow(layout, false) };
        }
        // SAFETY: same contract.
        unsafe { self.inner.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if thread_state::countdown(layout.size()) {
            // SAFETY: same contract.
            return unsafe { self.alloc_slow(layout, true) };
        }
        // SAFETY: same contract.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if sample_region::contains(p) {
            // Not a tail call (`black_box` keeps the result): with frame
            // pointers forced, a function whose every path ends in a tail
            // call gets its frame at the entry, so the unsampled free
            // paid three instructions for it; with a plain call here the
            // frame is set up on this path only.
            core::hint::black_box(sampled::release(p));
            return;
        }
        // SAFETY: p came from inner with this layout.
        unsafe { self.inner.dealloc(p, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let expired = thread_state::countdown(new_size);
        if !expired && !sample_region::contains(p) {
            // SAFETY: same contract.
            return unsafe { self.inner.realloc(p, layout, new_size) };
        }
        // SAFETY: same contract.
        unsafe { self.realloc_slow(p, layout, new_size, expired) }
    }
}
