//! Lifecycle of a sampled block: place it in the sample region, fire the
//! USDT probes, keep the counters. Non-generic on purpose: each probe site
//! exists once however many allocator front ends are instantiated.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::sample_region::{self, BadFree};
use crate::{errno, ledger, usdt};

static SAMPLED: AtomicU64 = AtomicU64::new(0);
static UNPLACED: AtomicU64 = AtomicU64::new(0);
static FREED: AtomicU64 = AtomicU64::new(0);
static LIVE_PAGES: AtomicU64 = AtomicU64::new(0);

/// Process-wide sampling counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Stats {
    /// Allocations the sampler selected (placed or not).
    pub sampled: u64,
    /// Selected allocations that could not be placed in the sample region
    /// (region exhausted or unavailable, alignment above 128 MiB, kernel
    /// refused): served by the backend and announced with a null pointer
    /// (see [`served_by_backend`]).
    pub unplaced_samples: u64,
    /// Sampled blocks released (free probe fired).
    pub freed: u64,
    /// Pages occupied by live sampled blocks (`ceil(size / 4096)` each).
    /// Freed slots kept warm by the region's cache are not counted.
    pub live_pages: u64,
}

pub fn stats() -> Stats {
    Stats {
        sampled: SAMPLED.load(Ordering::Relaxed),
        unplaced_samples: UNPLACED.load(Ordering::Relaxed),
        freed: FREED.load(Ordering::Relaxed),
        live_pages: LIVE_PAGES.load(Ordering::Relaxed),
    }
}

/// Place a sampled allocation and announce it; null if it cannot be placed
/// (counted in `unplaced_samples`; the caller allocates it from the backend
/// and passes the result through [`served_by_backend`]). With `zero` the block's
/// `size` bytes read as zero. errno is preserved (the region's first use
/// and lazy mode make syscalls that may fail).
#[inline(never)]
pub fn place(size: usize, align: usize, weight: u64, zero: bool) -> *mut u8 {
    SAMPLED.fetch_add(1, Ordering::Relaxed);
    match errno::preserving(|| sample_region::alloc(size, align, weight, zero)) {
        Some(p) => {
            LIVE_PAGES.fetch_add(sample_region::pages_for(size) as u64, Ordering::Relaxed);
            // Time and stack before the probe fires, the record after it
            // (see `ledger`: a reader must never see a record whose probe
            // has not fired).
            let captured = ledger::capture();
            usdt::alloc(p as usize, size, weight);
            if let Some(c) = captured {
                ledger::publish_alloc(sample_region::slot_id(p), p as usize, size, weight, &c);
            }
            p
        }
        None => {
            UNPLACED.fetch_add(1, Ordering::Relaxed);
            core::ptr::null_mut()
        }
    }
}

/// The backend served `served` (`size` bytes) where the sampler had chosen
/// the allocation (`weight` ≠ 0) but [`place`] could not place it: announce
/// it with pointer 0, so the profiler counts its weight as dropped instead
/// of losing it silently. (No free probe will follow: the block is not in
/// the region.) Returns `served`.
#[inline(always)]
pub fn served_by_backend<T>(served: *mut T, size: usize, weight: u64) -> *mut T {
    if weight != 0 && !served.is_null() {
        unplaced(size, weight);
    }
    served
}

#[cold]
#[inline(never)]
fn unplaced(size: usize, weight: u64) {
    usdt::alloc(0, size, weight);
}

/// Release a block for which `sample_region::contains` holds. errno is
/// preserved (free must not change it; the region may call madvise). A
/// block freed twice (or a pointer into the middle of a slot) aborts the
/// process, as glibc does, before the slot's free stack could be corrupted.
/// An unsampled block (`sample_region::alloc_unsampled`) only gives its
/// slot back: it fired no alloc probe and has no ledger record. Returns
/// whether the block was a sample.
#[cold]
#[inline(never)]
pub fn release(p: *mut u8) -> bool {
    let size = match sample_region::claim(p) {
        Ok(c) if c.sampled => c.size,
        Ok(_) => {
            errno::preserving(|| sample_region::release(p));
            return false;
        }
        Err(BadFree::DoubleFree) => fatal(b"double free of sampled block", p),
        Err(BadFree::InvalidPointer) => fatal(b"invalid pointer in the sample region", p),
    };
    // The record is retired before the probe fires (a reader that sees it
    // still live then finds the block in the kernel's live set, or not: it
    // never counts a block the kernel already retired), and both before
    // the slot is given back: another thread may reuse it at once, and its
    // alloc must not be announced before this free.
    if ledger::active() {
        ledger::publish_free(sample_region::slot_id(p));
    }
    usdt::free(p as usize);
    errno::preserving(|| sample_region::release(p));
    LIVE_PAGES.fetch_sub(sample_region::pages_for(size) as u64, Ordering::Relaxed);
    FREED.fetch_add(1, Ordering::Relaxed);
    true
}

/// `allocprof: free(): <what> 0x<p>` on stderr, then abort. No allocation
/// (the heap may be corrupt): the line is built on the stack and written
/// with write(2).
#[cold]
fn fatal(what: &[u8], p: *mut u8) -> ! {
    let mut buf = [0u8; 128];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if n < buf.len() {
                buf[n] = b;
                n += 1;
            }
        }
    };
    put(b"allocprof: free(): ");
    put(what);
    put(b" 0x");
    let v = p as usize;
    let digits = (usize::BITS - v.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        put(&[b"0123456789abcdef"[(v >> (4 * i)) & 0xf]]);
    }
    put(b"\n");
    // SAFETY: writes our stack buffer to stderr, then aborts the process
    // (abort is async-signal-safe and never returns).
    unsafe {
        libc::syscall(libc::SYS_write, 2, buf.as_ptr(), n);
        libc::abort()
    }
}
