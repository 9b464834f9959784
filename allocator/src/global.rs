//! `SamplingAllocator`: the sampler as a Rust `#[global_allocator]` wrapper
//! around any `GlobalAlloc`. Exports no C symbol: only Rust allocations of
//! the program that installs it are sampled.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;

use crate::{sample_region, sampled, thread_state};

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

    #[cold]
    #[inline(never)]
    unsafe fn alloc_slow(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let weight = thread_state::resolve(layout.size());
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
        let weight = if expired {
            thread_state::resolve(new_size)
        } else {
            0
        };
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
            sampled::release(p);
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
