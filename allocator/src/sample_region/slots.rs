//! The side table's per-slot records and each class's lock-free sources of
//! free slots (ABA-tagged Treiber stacks and a bump index).

use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::layout::{CLASS_COUNT, Layout};

/// Slot states (`SlotMeta::state`).
pub(super) const FREE: u32 = 0;
pub(super) const LIVE: u32 = 1;
/// Live, but not a sample: a big unsampled block in a warm slot
/// (`alloc_unsampled`). Freed without probe or ledger record.
pub(super) const UNSAMPLED: u32 = 2;

#[repr(C)]
pub(super) struct SlotMeta {
    pub(super) size: AtomicUsize,
    pub(super) weight: AtomicU64,
    /// Free-stack link: slot index + 1, 0 = end.
    pub(super) next: AtomicU32,
    /// Pages of the slot that may be resident (high-water mark of the
    /// blocks placed since the slot was last released cold).
    pub(super) dirty_pages: AtomicU32,
    /// `LIVE` (or `UNSAMPLED`) from placement until `free` claims it back.
    pub(super) state: AtomicU32,
}

#[repr(C, align(64))] // one cache line per class: no false sharing
pub(super) struct Class {
    /// Treiber heads: (ABA tag << 32) | (slot index + 1); 0 low = empty.
    pub(super) warm: AtomicU64,
    pub(super) cold: AtomicU64,
    /// `live << 32 | warm`: `warm` counts slots on (or being pushed to or
    /// popped from) the warm stack, see module docs; `live` the samples
    /// placed in this class and not yet released (it raises the warm
    /// limit). One word, so a placement or a release updates both with
    /// one atomic operation.
    pub(super) counts: AtomicU64,
    /// Slots `[0, bump)` have been handed out at least once.
    pub(super) bump: AtomicUsize,
    /// Slots `[0, prefix)` are the class's open prefix: dumped in a core
    /// (`MADV_DODUMP`; the rest is `MADV_DONTDUMP`) and, in lazy mode,
    /// readable and writable with their side-table and ledger records.
    /// Every slot ever placed lies in it; it never shrinks.
    pub(super) prefix: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to build CLASSES
const CLASS_INIT: Class = Class {
    warm: AtomicU64::new(0),
    cold: AtomicU64::new(0),
    counts: AtomicU64::new(0),
    bump: AtomicUsize::new(0),
    prefix: AtomicUsize::new(0),
};
/// `Class::counts` units.
pub(super) const ONE_WARM: u64 = 1;
pub(super) const ONE_LIVE: u64 = 1 << 32;

pub(super) static CLASSES: [Class; CLASS_COUNT] = [CLASS_INIT; CLASS_COUNT];

/// Resident bytes (dirty pages) reserved by the warm slots of the big
/// classes (`FIRST_BIG_CLASS..`): reserved before a push, given back after
/// a pop, so it is at least what those stacks hold at every instant and
/// never more than `WARM_BIG_BYTES`.
pub(super) static WARM_BIG: AtomicUsize = AtomicUsize::new(0);

pub(super) fn slot_meta<'a>(meta: *mut SlotMeta, l: &Layout, k: usize, idx: usize) -> &'a SlotMeta {
    debug_assert!(k < l.classes && idx < l.slots[k]);
    // SAFETY: the side table has `l.total_slots` entries, mapped for the
    // life of the process; every field is atomic, so shared references are
    // fine.
    unsafe { &*meta.add(l.id_base[k] + idx) }
}

pub(super) fn pop(head: &AtomicU64, meta: *mut SlotMeta, l: &Layout, k: usize) -> Option<usize> {
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
        let next = slot_meta(meta, l, k, top - 1).next.load(Ordering::Relaxed);
        let new = (((h >> 32).wrapping_add(1)) << 32) | u64::from(next);
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(top - 1),
            Err(cur) => h = cur,
        }
    }
}

pub(super) fn push(head: &AtomicU64, meta: *mut SlotMeta, l: &Layout, k: usize, idx: usize) {
    let link = &slot_meta(meta, l, k, idx).next;
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

pub(super) fn bump(l: &Layout, k: usize) -> Option<usize> {
    let b = &CLASSES[k].bump;
    // Load first so a full class is not bumped forever.
    if b.load(Ordering::Relaxed) >= l.slots[k] {
        return None;
    }
    let idx = b.fetch_add(1, Ordering::Relaxed);
    (idx < l.slots[k]).then_some(idx)
}
