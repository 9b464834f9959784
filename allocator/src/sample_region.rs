//! The sample region: one big reserved address range that holds every
//! sampled block, so `free` recognises a sampled pointer with one range
//! compare and never reads memory around unsampled ones.
//!
//! Layout: `CLASS_COUNT` classes of `CLASS_SPAN` bytes each; class `k` is
//! cut into slots of `PAGE << k` bytes. A block lives at the start of its
//! slot (so it is page aligned, and aligned to the slot size because the
//! region base is aligned to the largest slot). Per-slot size/weight/link
//! and a "possibly dirty pages" count live in a separate side table.
//!
//! Memory: the whole region is mapped `PROT_READ | PROT_WRITE` up front
//! with `MAP_NORESERVE`. Untouched pages cost nothing (no RSS, no commit
//! charge under the default overcommit policy), so placing a block needs no
//! syscall: its pages are committed by the first touch, like any fresh
//! anonymous memory, and it is one VMA however many slots are live (no
//! `vm.max_map_count` exposure).
//!
//! Reuse: each class has three sources of slots, tried in this order:
//! * a *warm* Treiber stack of freed slots whose pages were kept resident
//!   (no fault on reuse; the contents are stale, so `zero` requests
//!   memset the block). At most [`warm_limit`]`(k)` slots per class:
//!   [`WARM_MAX_SLOTS`] and at most [`WARM_MAX_BYTES`] of slot capacity, so
//!   the cache holds at most ~5 MiB process-wide and nothing for slots of
//!   2 MiB and more;
//! * a *cold* Treiber stack of freed slots whose pages were released with
//!   `madvise(MADV_DONTNEED)` when the warm stack was full (read as zero);
//! * a bump index of never-used slots (zero).
//!
//! So a sample costs syscalls only when its class's warm cache overflows,
//! and then exactly one `madvise`. Both stacks are ABA-tagged and share the
//! per-slot link (a slot is on at most one stack); the warm count is taken
//! before a push and dropped after a pop, so warm stack size <= count <=
//! limit holds at every instant.
//!
//! Strict overcommit (`vm.overcommit_memory = 2` ignores `MAP_NORESERVE`,
//! so a 64 GiB writable reservation fails): the region is then reserved
//! `PROT_NONE` and runs in *lazy* mode, where placement `mprotect`s the
//! block's pages and a cold release makes them `PROT_NONE` again (the old
//! per-sample syscall cost, only in that configuration).
//!
//! Lock-free throughout: a signal handler or fork child can never find a
//! lock held. Whatever cannot be placed is reported as `None` and the
//! caller falls back to an ordinary allocation.
//!
//! Not a debugging allocator: a stale pointer into a freed sampled block,
//! or an overflow past a block into the rest of its slot, reads/writes
//! ordinary memory (as with any malloc) instead of faulting.

use core::ptr;
use core::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

pub const PAGE: usize = 4096;
const PAGE_SHIFT: u32 = 12;
pub const CLASS_COUNT: usize = 16;
const CLASS_SHIFT: u32 = 32;
const CLASS_SPAN: usize = 1 << CLASS_SHIFT;
/// 64 GiB of address space (MAP_NORESERVE: only touched pages are charged).
pub const REGION_LEN: usize = CLASS_COUNT * CLASS_SPAN;
/// Largest slot; also the alignment of the region base.
pub const MAX_SLOT: usize = PAGE << (CLASS_COUNT - 1);
const TOTAL_SLOTS: usize = slot_id_base(CLASS_COUNT);
/// Most freed slots a class keeps warm (pages resident).
pub const WARM_MAX_SLOTS: usize = 8;
/// Most slot capacity (bytes) a class keeps warm.
pub const WARM_MAX_BYTES: usize = 1 << 20;

/// Before the region exists, `BASE` sits at the top of the address space
/// (kernel half), so `p - BASE < REGION_LEN` is false for every user
/// pointer and for NULL.
const UNMAPPED_BASE: usize = 0usize.wrapping_sub(REGION_LEN);

static BASE: AtomicUsize = AtomicUsize::new(UNMAPPED_BASE);
static META: AtomicPtr<SlotMeta> = AtomicPtr::new(ptr::null_mut());
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Region reserved PROT_NONE (strict overcommit): commit by mprotect.
static LAZY: AtomicBool = AtomicBool::new(false);
const UNINIT: u8 = 0;
const INITIALISING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

#[repr(C)]
struct SlotMeta {
    size: AtomicUsize,
    weight: AtomicU64,
    /// Free-stack link: slot index + 1, 0 = end.
    next: AtomicU32,
    /// Pages of the slot that may be resident (high-water mark of the
    /// blocks placed since the slot was last released cold).
    dirty_pages: AtomicU32,
}

#[repr(C, align(64))] // one cache line per class: no false sharing
struct Class {
    /// Treiber heads: (ABA tag << 32) | (slot index + 1); 0 low = empty.
    warm: AtomicU64,
    cold: AtomicU64,
    /// Slots on (or being pushed to) the warm stack; see module docs.
    warm_count: AtomicU32,
    /// Slots `[0, bump)` have been handed out at least once.
    bump: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to build CLASSES
const CLASS_INIT: Class = Class {
    warm: AtomicU64::new(0),
    cold: AtomicU64::new(0),
    warm_count: AtomicU32::new(0),
    bump: AtomicUsize::new(0),
};
static CLASSES: [Class; CLASS_COUNT] = [CLASS_INIT; CLASS_COUNT];

const fn slots_in_class(k: usize) -> usize {
    CLASS_SPAN >> (PAGE_SHIFT as usize + k)
}

/// Bytes per slot of class `k`.
pub const fn slot_bytes(k: usize) -> usize {
    PAGE << k
}

/// How many freed slots class `k` keeps warm.
pub const fn warm_limit(k: usize) -> u32 {
    let by_bytes = WARM_MAX_BYTES / slot_bytes(k);
    (if by_bytes < WARM_MAX_SLOTS {
        by_bytes
    } else {
        WARM_MAX_SLOTS
    }) as u32
}

/// Index of class `k`'s first slot in the side table.
const fn slot_id_base(k: usize) -> usize {
    let mut sum = 0;
    let mut j = 0;
    while j < k {
        sum += slots_in_class(j);
        j += 1;
    }
    sum
}

const SLOT_ID_BASE: [usize; CLASS_COUNT] = {
    let mut a = [0; CLASS_COUNT];
    let mut k = 0;
    while k < CLASS_COUNT {
        a[k] = slot_id_base(k);
        k += 1;
    }
    a
};

/// Whether `p` is (inside) the sample region. The only check on the
/// unsampled free path: one load of a read-mostly global and a compare.
#[inline(always)]
pub fn contains(p: *const u8) -> bool {
    (p as usize).wrapping_sub(load_relaxed_direct!(BASE => usize)) < REGION_LEN
}

/// The region's address range, once it exists.
pub fn bounds() -> Option<(usize, usize)> {
    let base = BASE.load(Ordering::Acquire);
    (base != UNMAPPED_BASE).then_some((base, REGION_LEN))
}

/// Pages a block of `size` bytes occupies (at least one).
pub const fn pages_for(size: usize) -> usize {
    if size == 0 { 1 } else { size.div_ceil(PAGE) }
}

/// Class for `pages` pages at `align`, or `None` if too big.
pub fn class_for(pages: usize, align: usize) -> Option<usize> {
    let by_size = pages.next_power_of_two().trailing_zeros() as usize;
    let by_align = if align > PAGE {
        (align.next_power_of_two().trailing_zeros() - PAGE_SHIFT) as usize
    } else {
        0
    };
    let k = by_size.max(by_align);
    (k < CLASS_COUNT).then_some(k)
}

/// Where a placed slot came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Warm,
    Cold,
    Bump,
}

/// Place a block of `size` bytes aligned to `align` (a power of two),
/// recording `weight`; with `zero`, its `size` bytes read as zero. `None`
/// if the region is unavailable or full, the block is too large or too
/// aligned, or (lazy mode only) the kernel refuses to commit it.
pub fn alloc(size: usize, align: usize, weight: u64, zero: bool) -> Option<*mut u8> {
    if size > MAX_SLOT {
        return None;
    }
    let pages = pages_for(size);
    let k = class_for(pages, align)?;
    let (base, meta) = ensure_mapped()?;
    let c = &CLASSES[k];
    let (idx, source) = if let Some(i) = pop(&c.warm, meta, k) {
        c.warm_count.fetch_sub(1, Ordering::Relaxed);
        (i, Source::Warm)
    } else if let Some(i) = pop(&c.cold, meta, k) {
        (i, Source::Cold)
    } else {
        (bump(k)?, Source::Bump)
    };
    let addr = base + (k << CLASS_SHIFT) + (idx << (PAGE_SHIFT as usize + k));
    if LAZY.load(Ordering::Relaxed) {
        // SAFETY: [addr, addr + pages*PAGE) lies inside slot `idx` of class
        // k, which we own exclusively now and which is part of our
        // reservation.
        let rc = unsafe {
            libc::mprotect(
                addr as *mut libc::c_void,
                pages * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            // Typically vm.max_map_count or the commit limit. Give the
            // slot back where it came from and let the caller fall back.
            match source {
                Source::Warm => {
                    c.warm_count.fetch_add(1, Ordering::Relaxed);
                    push(&c.warm, meta, k, idx);
                }
                Source::Cold | Source::Bump => push(&c.cold, meta, k, idx),
            }
            return None;
        }
    }
    let m = slot_meta(meta, k, idx);
    m.size.store(size, Ordering::Relaxed);
    m.weight.store(weight, Ordering::Relaxed);
    let dirty = m.dirty_pages.load(Ordering::Relaxed);
    if (pages as u32) > dirty {
        m.dirty_pages.store(pages as u32, Ordering::Relaxed);
    }
    if zero && source == Source::Warm {
        // SAFETY: the block's `size` bytes lie in its slot, which we own
        // and which is readable and writable (committed above in lazy
        // mode, always otherwise).
        unsafe { ptr::write_bytes(addr as *mut u8, 0, size) };
    }
    Some(addr as *mut u8)
}

/// Size and weight recorded for the block at `p` (which must be a live
/// block returned by [`alloc`]).
pub fn block_info(p: *const u8) -> (usize, u64) {
    let (meta, k, idx) = locate(p);
    let m = slot_meta(meta, k, idx);
    (
        m.size.load(Ordering::Relaxed),
        m.weight.load(Ordering::Relaxed),
    )
}

/// Bytes usable at `p`: its whole pages.
pub fn usable_size(p: *const u8) -> usize {
    pages_for(block_info(p).0) * PAGE
}

/// Release the block at `p` (a live block returned by [`alloc`]): keep its
/// slot warm if the class's cache has room, else drop the slot's pages
/// (`MADV_DONTNEED`; lazy mode also makes them `PROT_NONE`) and put it on
/// the cold stack. Returns the block's size. May change errno.
pub fn free(p: *mut u8) -> usize {
    let (meta, k, idx) = locate(p);
    let m = slot_meta(meta, k, idx);
    let size = m.size.load(Ordering::Relaxed);
    let c = &CLASSES[k];
    if c.warm_count.fetch_add(1, Ordering::Relaxed) < warm_limit(k) {
        push(&c.warm, meta, k, idx);
        return size;
    }
    c.warm_count.fetch_sub(1, Ordering::Relaxed);
    let len = m.dirty_pages.load(Ordering::Relaxed) as usize * PAGE;
    // SAFETY: `p` starts slot `idx`, which the caller gives up, and `len`
    // is at most the slot's size; both calls only change that range's
    // pages/protection.
    unsafe {
        libc::madvise(p.cast(), len, libc::MADV_DONTNEED);
        if LAZY.load(Ordering::Relaxed) {
            libc::mprotect(p.cast(), len, libc::PROT_NONE);
        }
    }
    m.dirty_pages.store(0, Ordering::Relaxed);
    push(&c.cold, meta, k, idx);
    size
}

fn locate(p: *const u8) -> (*mut SlotMeta, usize, usize) {
    let off = (p as usize).wrapping_sub(BASE.load(Ordering::Relaxed));
    let k = off >> CLASS_SHIFT;
    let idx = (off & (CLASS_SPAN - 1)) >> (PAGE_SHIFT as usize + k);
    (META.load(Ordering::Acquire), k, idx)
}

fn slot_meta<'a>(meta: *mut SlotMeta, k: usize, idx: usize) -> &'a SlotMeta {
    debug_assert!(k < CLASS_COUNT && idx < slots_in_class(k));
    // SAFETY: the side table has TOTAL_SLOTS entries, mapped for the life of
    // the process; every field is atomic, so shared references are fine.
    unsafe { &*meta.add(SLOT_ID_BASE[k] + idx) }
}

fn pop(head: &AtomicU64, meta: *mut SlotMeta, k: usize) -> Option<usize> {
    let mut h = head.load(Ordering::Acquire);
    loop {
        let top = (h & 0xffff_ffff) as usize;
        if top == 0 {
            return None;
        }
        // May read a link another thread is rewriting; the tag makes the
        // CAS fail in that case (any push or pop on this stack bumps it, and
        // a slot's link is only rewritten by pushing it, which needs it
        // popped first).
        let next = slot_meta(meta, k, top - 1).next.load(Ordering::Relaxed);
        let new = (((h >> 32).wrapping_add(1)) << 32) | u64::from(next);
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(top - 1),
            Err(cur) => h = cur,
        }
    }
}

fn push(head: &AtomicU64, meta: *mut SlotMeta, k: usize, idx: usize) {
    let link = &slot_meta(meta, k, idx).next;
    let mut h = head.load(Ordering::Relaxed);
    loop {
        link.store((h & 0xffff_ffff) as u32, Ordering::Relaxed);
        let new = (((h >> 32).wrapping_add(1)) << 32) | (idx as u64 + 1);
        match head.compare_exchange_weak(h, new, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(cur) => h = cur,
        }
    }
}

fn bump(k: usize) -> Option<usize> {
    let b = &CLASSES[k].bump;
    // Load first so a full class is not bumped forever.
    if b.load(Ordering::Relaxed) >= slots_in_class(k) {
        return None;
    }
    let idx = b.fetch_add(1, Ordering::Relaxed);
    (idx < slots_in_class(k)).then_some(idx)
}

/// Map the region and side table on first use. Never waits: a thread that
/// finds another one mid-initialisation gets `None` (an unplaced sample)
/// rather than spinning, which could deadlock a signal handler.
fn ensure_mapped() -> Option<(usize, *mut SlotMeta)> {
    match STATE.load(Ordering::Acquire) {
        READY => {
            return Some((BASE.load(Ordering::Relaxed), META.load(Ordering::Relaxed)));
        }
        UNINIT => {}
        _ => return None,
    }
    if STATE
        .compare_exchange(UNINIT, INITIALISING, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        return ensure_mapped_ready();
    }
    match map_region() {
        Some((base, meta, lazy)) => {
            LAZY.store(lazy, Ordering::Relaxed);
            META.store(meta, Ordering::Release);
            BASE.store(base, Ordering::Release);
            STATE.store(READY, Ordering::Release);
            Some((base, meta))
        }
        None => {
            STATE.store(FAILED, Ordering::Release);
            None
        }
    }
}

fn ensure_mapped_ready() -> Option<(usize, *mut SlotMeta)> {
    (STATE.load(Ordering::Acquire) == READY)
        .then(|| (BASE.load(Ordering::Relaxed), META.load(Ordering::Relaxed)))
}

const PR_SET_VMA: libc::c_int = 0x5356_4d41;
const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;

/// Fresh anonymous `MAP_NORESERVE` mapping of `len` bytes, or `None`.
fn map_anon(len: usize, prot: libc::c_int) -> Option<usize> {
    // SAFETY: fresh anonymous mapping at a kernel-chosen address; no
    // existing mapping is touched.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Reserve the region (writable; `PROT_NONE` + lazy mode if the kernel
/// refuses a writable reservation) and the side table. Returns (base,
/// side table, lazy).
fn map_region() -> Option<(usize, *mut SlotMeta, bool)> {
    let reserve = REGION_LEN + MAX_SLOT;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let (raw, lazy) = match map_anon(reserve, rw) {
        Some(raw) => (raw, false),
        None => (map_anon(reserve, libc::PROT_NONE)?, true),
    };
    let base = (raw + MAX_SLOT - 1) & !(MAX_SLOT - 1);
    // SAFETY: trims the unaligned head and tail of our own reservation.
    unsafe {
        if base > raw {
            libc::munmap(raw as *mut libc::c_void, base - raw);
        }
        let end = base + REGION_LEN;
        let raw_end = raw + reserve;
        if raw_end > end {
            libc::munmap(end as *mut libc::c_void, raw_end - end);
        }
    }
    let meta_len = TOTAL_SLOTS * size_of::<SlotMeta>();
    // Zero pages are a valid all-empty side table (atomics of 0).
    let Some(meta) = map_anon(meta_len, rw) else {
        // SAFETY: releases the reservation made above.
        unsafe { libc::munmap(base as *mut libc::c_void, REGION_LEN) };
        return None;
    };
    // SAFETY: names our own anonymous mappings; failure (kernel without
    // CONFIG_ANON_VMA_NAME) is harmless and ignored.
    unsafe {
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            base as libc::c_ulong,
            REGION_LEN as libc::c_ulong,
            c"allocprof-samples".as_ptr() as libc::c_ulong,
        );
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            meta as libc::c_ulong,
            meta_len as libc::c_ulong,
            c"allocprof-meta".as_ptr() as libc::c_ulong,
        );
    }
    Some((base, meta as *mut SlotMeta, lazy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_for(1, 16), Some(0));
        assert_eq!(class_for(2, 16), Some(1));
        assert_eq!(class_for(3, 16), Some(2));
        assert_eq!(class_for(1, 8192), Some(1));
        assert_eq!(class_for(1, MAX_SLOT), Some(CLASS_COUNT - 1));
        assert_eq!(class_for(1, MAX_SLOT * 2), None);
        assert_eq!(class_for(MAX_SLOT / PAGE, 16), Some(CLASS_COUNT - 1));
        assert_eq!(class_for(MAX_SLOT / PAGE + 1, 16), None);
        assert_eq!(TOTAL_SLOTS, (1 << 21) - (1 << 5));
    }

    #[test]
    fn warm_limits() {
        assert_eq!(warm_limit(0), 8);
        assert_eq!(warm_limit(5), 8); // 8 x 128 KiB = 1 MiB
        assert_eq!(warm_limit(6), 4);
        assert_eq!(warm_limit(8), 1);
        assert_eq!(warm_limit(9), 0);
        assert_eq!(warm_limit(CLASS_COUNT - 1), 0);
        let total: usize = (0..CLASS_COUNT)
            .map(|k| warm_limit(k) as usize * slot_bytes(k))
            .sum();
        assert!(total <= 5 << 20, "{total}");
    }

    /// Resident pages of `[p, p + len)` (mincore).
    fn resident(p: *mut u8, len: usize) -> usize {
        let mut v = [0u8; 64];
        assert!(len / PAGE <= v.len());
        // SAFETY: p is page aligned and mapped; v holds len/PAGE entries.
        let rc = unsafe { libc::mincore(p.cast(), len, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v[..len / PAGE].iter().filter(|&&b| b & 1 != 0).count()
    }

    // All region tests in one function: the region and its caches are
    // process-wide and the test harness runs tests in parallel.
    #[test]
    fn alloc_free_reuse_and_alignment() {
        let p = alloc(100, 16, 7, false).expect("placed");
        assert!(contains(p));
        assert_eq!(p as usize % PAGE, 0);
        assert_eq!(block_info(p), (100, 7));
        assert_eq!(usable_size(p), PAGE);
        // SAFETY: p has PAGE usable bytes.
        unsafe { p.write_bytes(0xab, PAGE) };
        assert_eq!(free(p), 100);

        let q = alloc(3 * PAGE + 1, 1 << 20, 1, false).expect("placed");
        assert_eq!(q as usize % (1 << 20), 0);
        assert_eq!(usable_size(q), 4 * PAGE);
        free(q);
        assert!(alloc(MAX_SLOT + 1, 16, 1, false).is_none());
        assert!(!contains(ptr::null()));

        // Warm reuse: class 2 (3-4 pages) keeps up to 8 freed slots
        // resident; `zero` clears stale contents of a warm slot.
        let k = 2;
        let n = warm_limit(k) as usize + 4;
        let blocks: Vec<*mut u8> = (0..n)
            .map(|_| {
                let b = alloc(3 * PAGE, 16, 1, true).expect("placed");
                // SAFETY: 3 pages usable; the block reads as zero.
                unsafe {
                    assert!(
                        core::slice::from_raw_parts(b, 3 * PAGE)
                            .iter()
                            .all(|&x| x == 0)
                    );
                    b.write_bytes(0x5a, 3 * PAGE);
                }
                b
            })
            .collect();
        for &b in &blocks {
            assert_eq!(resident(b, 4 * PAGE), 3);
            free(b);
        }
        // The first `limit` frees stayed warm, the rest were released.
        let warm = blocks[..warm_limit(k) as usize]
            .iter()
            .filter(|&&b| resident(b, 4 * PAGE) == 3)
            .count();
        assert_eq!(warm, warm_limit(k) as usize);
        for &b in &blocks[warm_limit(k) as usize..] {
            assert_eq!(resident(b, 4 * PAGE), 0);
        }
        // Reuse order: warm slots first (stale data unless `zero`), then
        // cold ones (zero pages).
        let again: Vec<*mut u8> = (0..n)
            .map(|i| alloc(4 * PAGE, 16, 1, i % 2 == 0).expect("placed"))
            .collect();
        for (i, &b) in again.iter().enumerate() {
            assert!(blocks.contains(&b), "reused a freed slot");
            // SAFETY: 4 pages usable.
            let bytes = unsafe { core::slice::from_raw_parts(b, 4 * PAGE) };
            let was_warm = i < warm_limit(k) as usize;
            if i % 2 == 0 || !was_warm {
                assert!(bytes.iter().all(|&x| x == 0), "block {i}");
            } else {
                assert!(bytes[..3 * PAGE].iter().all(|&x| x == 0x5a), "block {i}");
            }
        }
        for &b in &again {
            free(b);
        }
    }
}
