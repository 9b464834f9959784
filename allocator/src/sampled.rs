//! Lifecycle of a sampled block: place it in the sample region, fire the
//! USDT probes, keep the counters. Non-generic on purpose: each probe site
//! exists once however many allocator front ends are instantiated.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::{sample_region, usdt};

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
    /// (region full or unavailable, too large, too aligned, kernel refused):
    /// served unsampled, no probe fired.
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
/// (counted in `unplaced_samples`; the caller allocates it normally). With
/// `zero` the block's `size` bytes read as zero.
#[inline(never)]
pub fn place(size: usize, align: usize, weight: u64, zero: bool) -> *mut u8 {
    SAMPLED.fetch_add(1, Ordering::Relaxed);
    match sample_region::alloc(size, align, weight, zero) {
        Some(p) => {
            LIVE_PAGES.fetch_add(sample_region::pages_for(size) as u64, Ordering::Relaxed);
            usdt::alloc(p as usize, size, weight);
            p
        }
        None => {
            UNPLACED.fetch_add(1, Ordering::Relaxed);
            core::ptr::null_mut()
        }
    }
}

/// Release a block for which `sample_region::contains` holds. errno is
/// preserved (free must not change it; the region may call madvise).
#[cold]
#[inline(never)]
pub fn release(p: *mut u8) {
    usdt::free(p as usize);
    let size = crate::errno::preserving(|| sample_region::free(p));
    LIVE_PAGES.fetch_sub(sample_region::pages_for(size) as u64, Ordering::Relaxed);
    FREED.fetch_add(1, Ordering::Relaxed);
}
