//! The sample region: one big reserved address range that holds every
//! sampled block, so `free` recognises a sampled pointer with one range
//! compare and never reads memory around unsampled ones.
//!
//! Layout: `CLASS_COUNT` classes of `CLASS_SPAN` bytes each; class `k` is
//! cut into slots of `PAGE << k` bytes. A block lives at the start of its
//! slot (so it is page aligned, and aligned to the slot size because the
//! region base is aligned to the largest slot), and only its
//! `ceil(size / PAGE)` pages are committed (mprotect RW); the rest of the
//! slot stays PROT_NONE and costs nothing. Each class has a lock-free
//! Treiber free stack (ABA-tagged) plus a bump index of never-used slots;
//! per-slot size/weight/next live in a separate side table.
//!
//! Lock-free throughout: a signal handler or fork child can never find a
//! lock held. Whatever cannot be placed is reported as `None` and the
//! caller falls back to an ordinary allocation.

use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

pub const PAGE: usize = 4096;
const PAGE_SHIFT: u32 = 12;
pub const CLASS_COUNT: usize = 16;
const CLASS_SHIFT: u32 = 32;
const CLASS_SPAN: usize = 1 << CLASS_SHIFT;
/// 64 GiB of address space (MAP_NORESERVE, PROT_NONE: no memory charged).
pub const REGION_LEN: usize = CLASS_COUNT * CLASS_SPAN;
/// Largest slot; also the alignment of the region base.
pub const MAX_SLOT: usize = PAGE << (CLASS_COUNT - 1);
const TOTAL_SLOTS: usize = slot_id_base(CLASS_COUNT);

/// Before the region exists, `BASE` sits at the top of the address space
/// (kernel half), so `p - BASE < REGION_LEN` is false for every user
/// pointer and for NULL.
const UNMAPPED_BASE: usize = 0usize.wrapping_sub(REGION_LEN);

static BASE: AtomicUsize = AtomicUsize::new(UNMAPPED_BASE);
static META: AtomicPtr<SlotMeta> = AtomicPtr::new(ptr::null_mut());
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
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
}

struct Class {
    /// (ABA tag << 32) | (slot index + 1); 0 in the low half = empty.
    free_head: AtomicU64,
    /// Slots `[0, bump)` have been handed out at least once.
    bump: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to build CLASSES
const CLASS_INIT: Class = Class {
    free_head: AtomicU64::new(0),
    bump: AtomicUsize::new(0),
};
static CLASSES: [Class; CLASS_COUNT] = [CLASS_INIT; CLASS_COUNT];

const fn slots_in_class(k: usize) -> usize {
    CLASS_SPAN >> (PAGE_SHIFT as usize + k)
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
    (p as usize).wrapping_sub(BASE.load(Ordering::Relaxed)) < REGION_LEN
}

/// The region's address range, once it exists.
pub fn bounds() -> Option<(usize, usize)> {
    let base = BASE.load(Ordering::Acquire);
    (base != UNMAPPED_BASE).then_some((base, REGION_LEN))
}

/// Pages a block of `size` bytes commits (at least one).
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

/// Place a block of `size` bytes aligned to `align` (a power of two),
/// recording `weight`. `None` if the region is unavailable or full, the
/// block is too large or too aligned, or the kernel refuses to commit it.
pub fn alloc(size: usize, align: usize, weight: u64) -> Option<*mut u8> {
    if size > MAX_SLOT {
        return None;
    }
    let pages = pages_for(size);
    let k = class_for(pages, align)?;
    let (base, meta) = ensure_mapped()?;
    let idx = pop(meta, k).or_else(|| bump(k))?;
    let addr = base + (k << CLASS_SHIFT) + (idx << (PAGE_SHIFT as usize + k));
    // SAFETY: [addr, addr + pages*PAGE) lies inside slot `idx` of class k,
    // which we own exclusively now and which is part of our reservation.
    let rc = unsafe {
        libc::mprotect(
            addr as *mut libc::c_void,
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    if rc != 0 {
        // Typically vm.max_map_count: every committed slot may be its own
        // VMA. Give the slot back and let the caller fall back.
        push(meta, k, idx);
        return None;
    }
    let m = slot_meta(meta, k, idx);
    m.size.store(size, Ordering::Relaxed);
    m.weight.store(weight, Ordering::Relaxed);
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

/// Bytes usable at `p`: its committed pages.
pub fn usable_size(p: *const u8) -> usize {
    pages_for(block_info(p).0) * PAGE
}

/// Release the block at `p`: drop its pages and make the slot PROT_NONE
/// again (a stale access faults instead of reading a reused block).
/// Returns the block's size.
pub fn free(p: *mut u8) -> usize {
    let (meta, k, idx) = locate(p);
    let size = slot_meta(meta, k, idx).size.load(Ordering::Relaxed);
    let len = pages_for(size) * PAGE;
    // SAFETY: `p` starts a committed slot of `len` bytes that the caller
    // gives up; both calls only change that range's pages/protection.
    unsafe {
        libc::madvise(p.cast(), len, libc::MADV_DONTNEED);
        libc::mprotect(p.cast(), len, libc::PROT_NONE);
    }
    push(meta, k, idx);
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

fn pop(meta: *mut SlotMeta, k: usize) -> Option<usize> {
    let head = &CLASSES[k].free_head;
    let mut h = head.load(Ordering::Acquire);
    loop {
        let top = (h & 0xffff_ffff) as usize;
        if top == 0 {
            return None;
        }
        // May read a link another thread is rewriting; the tag makes the
        // CAS fail in that case.
        let next = slot_meta(meta, k, top - 1).next.load(Ordering::Relaxed);
        let new = (((h >> 32).wrapping_add(1)) << 32) | u64::from(next);
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(top - 1),
            Err(cur) => h = cur,
        }
    }
}

fn push(meta: *mut SlotMeta, k: usize, idx: usize) {
    let head = &CLASSES[k].free_head;
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
        Some((base, meta)) => {
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

fn map_region() -> Option<(usize, *mut SlotMeta)> {
    let reserve = REGION_LEN + MAX_SLOT;
    // SAFETY: fresh anonymous PROT_NONE reservation; no existing mapping is
    // touched.
    let raw = unsafe {
        libc::mmap(
            ptr::null_mut(),
            reserve,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let raw = raw as usize;
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
    let meta_len = TOTAL_SLOTS * core::mem::size_of::<SlotMeta>();
    // SAFETY: fresh anonymous mapping; zero pages are a valid all-empty
    // side table (atomics of 0).
    let meta = unsafe {
        libc::mmap(
            ptr::null_mut(),
            meta_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if meta == libc::MAP_FAILED {
        // SAFETY: releases the reservation made above.
        unsafe { libc::munmap(base as *mut libc::c_void, REGION_LEN) };
        return None;
    }
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
    Some((base, meta.cast()))
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
    fn alloc_free_reuse_and_alignment() {
        let p = alloc(100, 16, 7).expect("placed");
        assert!(contains(p));
        assert_eq!(p as usize % PAGE, 0);
        assert_eq!(block_info(p), (100, 7));
        assert_eq!(usable_size(p), PAGE);
        // SAFETY: p has PAGE committed bytes.
        unsafe { p.write_bytes(0xab, PAGE) };
        assert_eq!(free(p), 100);

        let q = alloc(3 * PAGE + 1, 1 << 20, 1).expect("placed");
        assert_eq!(q as usize % (1 << 20), 0);
        assert_eq!(usable_size(q), 4 * PAGE);
        free(q);
        assert!(alloc(MAX_SLOT + 1, 16, 1).is_none());
        assert!(!contains(ptr::null()));
    }
}
