//! The backend's own figures (reserved, committed, in use, free), kept in
//! the block `profiler_common::backend_stats` lays out, for allocprof to
//! read from outside with `process_vm_readv`.
//!
//! The block is refreshed on the sampling slow paths, after a sampled
//! allocation or free: the fast path is untouched. A backend's figures must
//! be cheap to get and take no lock (glibc's `mallinfo2` walks every free
//! chunk under its arena locks, tens of milliseconds: glibc gives none);
//! still, after each refresh the next waits [`COST_FACTOR`] times as long as
//! this one took, and at least [`MIN_INTERVAL_NS`]: the refreshes take at
//! most about 1% of the time of the threads that make them, and a cheap
//! backend (mimalloc: two counters) is refreshed at nearly every sample.
//! The block shows the heap as of the last refresh; its time says how old
//! that is (a process that stopped allocating keeps its last figures).
//!
//! An ELF note (emitted by [`publish`]'s assembly) carries the block's
//! address, so allocprof finds it in the library file without symbols.

use core::sync::atomic::{AtomicU64, Ordering, fence};

use profiler_common::backend_stats::{MAGIC, UNKNOWN, VERSION, WORDS, word};

use crate::backend::Backend;

/// The wait after a refresh, in multiples of its own duration.
pub const COST_FACTOR: u64 = 100;
/// The shortest wait between refreshes (CLOCK_MONOTONIC nanoseconds).
pub const MIN_INTERVAL_NS: u64 = 1_000_000;

/// When the next refresh may happen (CLOCK_MONOTONIC nanoseconds).
static NEXT_REFRESH_NS: AtomicU64 = AtomicU64::new(0);

/// A backend's figures; those it does not keep are
/// `profiler_common::backend_stats::UNKNOWN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    /// `profiler_common::backend_stats::BACKEND_*`.
    pub backend: u64,
    pub reserved: u64,
    pub committed: u64,
    pub in_use: u64,
    pub free: u64,
    pub mmapped: u64,
}

#[repr(C, align(64))]
struct Block([AtomicU64; WORDS]);

const fn word_init(i: usize) -> AtomicU64 {
    AtomicU64::new(match i {
        word::MAGIC => MAGIC,
        word::VERSION => VERSION,
        word::ALLOC_THIN_FACTOR => 1,
        word::ALLOC_MAX_EVENT_RATE => UNKNOWN,
        _ => 0,
    })
}

/// Non-zero from the start (the magic), so it lies in `.data`: a part of
/// the library file, which the note's address can name.
static BLOCK: Block = Block([
    word_init(0),
    word_init(1),
    word_init(2),
    word_init(3),
    word_init(4),
    word_init(5),
    word_init(6),
    word_init(7),
    word_init(8),
    word_init(9),
    word_init(10),
    word_init(11),
    word_init(12),
]);

// The allocator's budget (`crate::budget`) writes its words on its own,
// outside the sequence lock: a counter and two settings, each read alone.

/// One more sampled allocation dropped by the budget.
pub(crate) fn count_thinned() {
    BLOCK.0[word::ALLOC_THINNED].fetch_add(1, Ordering::Relaxed);
}

/// The thinning factor now in force (written only when it changes, so the
/// busy process's threads do not all write the line on every sample).
pub(crate) fn publish_factor(factor: u64) {
    let w = &BLOCK.0[word::ALLOC_THIN_FACTOR];
    if w.load(Ordering::Relaxed) != factor {
        w.store(factor, Ordering::Relaxed);
    }
}

/// The budget the process read from its environment.
pub(crate) fn publish_budget(per_second: u64) {
    BLOCK.0[word::ALLOC_MAX_EVENT_RATE].store(per_second, Ordering::Relaxed);
}

/// A fork child's thinning starts afresh (its budget stays).
pub(crate) fn reset_thinning() {
    BLOCK.0[word::ALLOC_THINNED].store(0, Ordering::Relaxed);
    BLOCK.0[word::ALLOC_THIN_FACTOR].store(1, Ordering::Relaxed);
}

/// After a sampled allocation or free: refresh the block if its wait is
/// over and the backend has figures. Slow paths only.
#[inline]
pub(crate) fn refresh<B: Backend>() {
    let start = crate::clock::monotonic_ns();
    if start < NEXT_REFRESH_NS.load(Ordering::Relaxed) {
        return;
    }
    let Some(figures) = B::figures() else {
        return;
    };
    let end = crate::clock::monotonic_ns();
    let wait = end
        .saturating_sub(start)
        .saturating_mul(COST_FACTOR)
        .max(MIN_INTERVAL_NS);
    NEXT_REFRESH_NS.store(end.saturating_add(wait), Ordering::Relaxed);
    publish(&figures, end);
}

/// Writes the figures under the sequence lock; a thread that finds another
/// one writing leaves it to that one.
#[cold]
#[inline(never)]
fn publish(f: &Figures, now: u64) {
    // The note naming the block (see profiler_common::backend_stats):
    // non-alloc, like `.note.stapsdt`, so it costs no memory at run time.
    // SAFETY: assembler directives only: they add a note to another
    // section and emit no instruction.
    unsafe {
        core::arch::asm!(
            ".pushsection .note.allocprof,\"\",\"note\"",
            ".balign 4",
            ".4byte 992f-991f, 994f-993f, 1",
            "991: .asciz \"allocprof\"",
            "992: .balign 4",
            "993: .8byte {block}",
            "994: .balign 4",
            ".popsection",
            block = sym BLOCK,
            options(nomem, nostack, preserves_flags),
        );
    }
    let words = &BLOCK.0;
    let seq = words[word::SEQ].load(Ordering::Relaxed);
    if seq % 2 == 1
        || words[word::SEQ]
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    fence(Ordering::Release);
    for (i, v) in [
        (word::BACKEND, f.backend),
        (word::RESERVED, f.reserved),
        (word::COMMITTED, f.committed),
        (word::IN_USE, f.in_use),
        (word::FREE, f.free),
        (word::MMAPPED, f.mmapped),
        (word::REFRESHED_NS, now.max(1)),
    ] {
        words[i].store(v, Ordering::Relaxed);
    }
    words[word::SEQ].store(seq + 2, Ordering::Release);
}

/// A copy of the block's words.
#[cfg(test)]
fn snapshot() -> [u64; WORDS] {
    core::array::from_fn(|i| BLOCK.0[i].load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::backend_stats::{self as layout, BACKEND_GLIBC, HEAD_WORDS};

    struct Fake;
    // SAFETY: never allocates; only `figures` is called.
    unsafe impl Backend for Fake {
        unsafe fn malloc(_: usize) -> *mut core::ffi::c_void {
            unreachable!()
        }
        unsafe fn calloc(_: usize) -> *mut core::ffi::c_void {
            unreachable!()
        }
        unsafe fn realloc(_: *mut core::ffi::c_void, _: usize) -> *mut core::ffi::c_void {
            unreachable!()
        }
        unsafe fn free(_: *mut core::ffi::c_void) {}
        unsafe fn memalign(_: usize, _: usize) -> *mut core::ffi::c_void {
            unreachable!()
        }
        unsafe fn usable_size(_: *mut core::ffi::c_void) -> usize {
            0
        }
        fn figures() -> Option<Figures> {
            Some(Figures {
                backend: BACKEND_GLIBC,
                reserved: 1 << 20,
                committed: UNKNOWN,
                in_use: 3 << 18,
                free: 1 << 18,
                mmapped: 0,
            })
        }
    }

    #[test]
    fn a_refresh_fills_a_block_the_reader_accepts_and_waits_its_interval() {
        refresh::<Fake>();
        let b = snapshot();
        let head: [u64; HEAD_WORDS] = b[..HEAD_WORDS].try_into().unwrap();
        let f = layout::decode(&head, &head).unwrap();
        assert_eq!(f.version, VERSION);
        assert!(layout::decode_thinning(&b).is_some());
        assert_eq!(f.in_use, Some(3 << 18));
        assert_eq!(f.committed, None);
        // Right after, within the minimum interval, nothing is rewritten.
        let next = NEXT_REFRESH_NS.load(Ordering::Relaxed);
        assert!(next >= f.refreshed_ns + MIN_INTERVAL_NS);
        if crate::clock::monotonic_ns() < next {
            refresh::<Fake>();
            assert_eq!(snapshot()[word::SEQ], b[word::SEQ]);
        }
    }
}
