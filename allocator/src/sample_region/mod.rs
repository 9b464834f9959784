//! The sample region: one reserved address range that holds every sampled
//! block, so `free` recognises a sampled pointer with one range compare and
//! never reads memory around unsampled ones.
//!
//! Layout ([`Layout`], chosen once at first use): classes of slots of
//! `PAGE << k` bytes, from 4 KiB up to 4 GiB. The full layout gives every
//! class up to 128 MiB slots 4 GiB of address space and the huge classes
//! (256 MiB .. 4 GiB) at least four slots: 100 GiB in all. A block lives at
//! the start of its slot, so it is page aligned and aligned to
//! `min(slot, MAX_ALIGN)` (class bases are aligned that way). Per-slot
//! size/weight/link/state and a "possibly dirty pages" count live in a
//! separate side table.
//!
//! Size: under `RLIMIT_AS` (or when the kernel refuses the full range) the
//! layout is scaled down by powers of two: smaller classes get less space
//! and the largest classes are dropped, rather than having no region at
//! all (a 64 GiB reservation under `ulimit -v 8000000` used to fail and the
//! process was never sampled).
//!
//! Placement: a block goes to the smallest class that fits its size and
//! alignment; a class with no free slot spills into the next larger class,
//! so however many samples of one size are live they are placed while any
//! larger class has room. A sample that still cannot be placed (region
//! exhausted or unavailable, block larger than the largest slot, alignment
//! above `MAX_ALIGN`) is reported as `None`; the caller announces it with a
//! null pointer so its weight is not lost.
//!
//! Memory: the whole region is mapped `PROT_READ | PROT_WRITE` up front
//! with `MAP_NORESERVE`. Untouched pages cost nothing (no RSS, no commit
//! charge under the default overcommit policy), so placing a block needs no
//! syscall (but for the open prefix's growth, below): its pages are
//! committed by the first touch, like any fresh anonymous memory. The region is `MADV_NOHUGEPAGE` (under THP `always` a
//! 4 KiB slot could otherwise pin a 2 MiB page).
//!
//! Open prefix: each class's slots `[0, prefix)`, which holds every slot
//! ever placed, grows in chunks of [`COMMIT_CHUNK`] bytes (at least one
//! slot) when a never-used slot beyond it is handed out: one `madvise` per
//! chunk. It is `MADV_DODUMP` and the rest of the region `MADV_DONTDUMP`,
//! so a core dump holds the live (and warm) sampled blocks but not 100 GiB
//! of empty address space (freed cold slots are unpopulated: holes the
//! kernel skips). The prefix never shrinks, so the region is at most two
//! VMAs per class however many samples are live: no `vm.max_map_count`
//! exposure. The side table and the ledger's table stay `MADV_DONTDUMP`.
//!
//! Reuse: each class has three sources of slots, tried in this order:
//! * a *warm* Treiber stack of freed slots whose pages were kept resident
//!   (no fault on reuse; the contents are stale, so `zero` requests
//!   clear the block's whole pages, all that `malloc_usable_size`
//!   reports). Up to 1 MiB slots, at most [`warm_limit_with_live`] slots
//!   per class: a fixed part of [`WARM_MAX_SLOTS`] and at most
//!   [`WARM_MAX_BYTES`] of slot capacity (at most ~7 MiB process-wide),
//!   plus, for slots up to 32 KiB, one slot per live sample of the class,
//!   so that the wander of the live count in a steady churn does not turn
//!   frees into syscalls. Slots of 2 MiB and more share one process-wide
//!   budget of [`WARM_BIG_BYTES`] (64 MiB) of resident pages: a churn of
//!   big blocks (nearly all sampled at the default rate) reuses its slots
//!   without faulting them back in, where releasing each cost 6-11x the
//!   backend's time;
//! * a *cold* Treiber stack of freed slots whose pages were released with
//!   `madvise(MADV_DONTNEED)` when the warm stack was full (read as zero);
//! * a bump index of never-used slots (zero).
//!
//! A warm slot may also take a big *unsampled* block ([`alloc_unsampled`]:
//! never a cold or fresh slot), so that a churn of big blocks writes one
//! buffer whether or not each block is sampled; its state marks it
//! unsampled, and `free` gives it back without probe or ledger record.
//!
//! So a sample costs syscalls only when its class's warm cache overflows,
//! and then exactly one `madvise`, or when it grows its class's open
//! prefix. Both stacks are ABA-tagged and share the
//! per-slot link (a slot is on at most one stack); the warm count is taken
//! before a push and dropped after a pop (when the popped slot is placed,
//! together with the class's live count: one atomic add), so warm stack
//! size <= count holds at every instant, and count <= limit whenever a
//! release compares them (likewise the big classes' resident bytes and
//! their budget).
//!
//! Double free: each slot has a live/unsampled/free state that `free` flips
//! with one swap, so freeing a block twice is caught before its slot could be pushed
//! twice (which would link the stack to itself and hand the same pointer to
//! two callers); the caller aborts, as glibc does.
//!
//! Strict overcommit (`vm.overcommit_memory = 2` ignores `MAP_NORESERVE`
//! and charges every private writable mapping whole: ~700 MiB for the full
//! layout's side and ledger tables): the region, the side table and the
//! ledger's table are then reserved `PROT_NONE` and run in *lazy* mode,
//! where growing a class's open prefix also commits (`mprotect`) its slots'
//! side-table and ledger records, then the slots: a record is writable
//! before its slot is placed, and the commit charge is the classes'
//! high-water marks (rounded up to a chunk) and their records. Still at
//! most two VMAs per class in each mapping.
//!
//! Fork: the initialising state names a page that fork clears
//! (`MADV_WIPEONFORK`), so a child forked in the middle of it redoes the
//! work instead of waiting for a thread it does not have (see
//! [`initialise`]).
//!
//! Lock-free throughout: a signal handler or fork child can never find a
//! lock held.
//!
//! Not a debugging allocator: a stale pointer into a freed sampled block,
//! or an overflow past a block into the rest of its slot, reads/writes
//! ordinary memory (as with any malloc) instead of faulting.
//!
//! (Over 600 lines on purpose: the region's alloc, free and realloc paths
//! share one lock-free state protocol and read together; layout, mapping
//! and slots are already apart.)

mod layout;
mod mapping;
mod slots;
#[cfg(test)]
mod tests;

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

pub use self::layout::{
    CLASS_COUNT, COMMIT_CHUNK, FIRST_BIG_CLASS, LAYOUT_COUNT, Layout, MAX_ALIGN, MAX_SLOT, PAGE,
    WARM_BIG_BYTES, WARM_MAX_BYTES, WARM_MAX_SLOTS, class_for, layout, pages_for, slot_bytes,
    warm_limit, warm_limit_with_live,
};
use self::{
    layout::{LAYOUTS, PAGE_SHIFT},
    mapping::{map_region, warn},
    slots::{
        CLASSES, FREE, LIVE, ONE_LIVE, ONE_WARM, SlotMeta, UNSAMPLED, WARM_BIG, bump, pop, push,
        slot_meta,
    },
};

/// The largest region ever used: before the region exists, `BOUNDS.base` sits
/// this far below the top of the address space (kernel half), so
/// `p - base < len` is false for every user pointer and NULL whichever of
/// base and len a racing reader sees first.
const MAX_REGION_LEN: usize = LAYOUTS[0].len;
const UNMAPPED_BASE: usize = 0usize.wrapping_sub(MAX_REGION_LEN);

/// The region's range: `p - base < len` is the whole "is it sampled?"
/// test of `free`, so both words share one cache line of their own (read on
/// every free, written once). `len` is 0 until the region exists. Public
/// only for the `free` entries that read it outside Rust: the assembly of
/// `export_c_allocator!` and liballocprof.so's C `free` (`base` at offset 0,
/// `len` at 8).
#[doc(hidden)]
#[repr(C, align(64))]
pub struct Bounds {
    pub base: AtomicUsize,
    pub len: AtomicUsize,
}

// `BOUNDS` is defined here in assembly under a fixed, hidden name, so that
// C code linked into the same library (preload/c/entries.c) can read it
// rip-relative, as the assembly entries do; a Rust `#[no_mangle]` static
// would be exported from the cdylib.
core::arch::global_asm!(
    ".pushsection .data.__allocprof_sample_bounds,\"aw\",@progbits",
    ".balign 64",
    ".globl __allocprof_sample_bounds",
    ".hidden __allocprof_sample_bounds",
    ".type __allocprof_sample_bounds,@object",
    ".size __allocprof_sample_bounds,64",
    "__allocprof_sample_bounds:",
    ".quad {base}",
    ".quad 0",
    ".zero 48",
    ".popsection",
    base = const UNMAPPED_BASE,
);
const _: () = assert!(size_of::<Bounds>() == 64);

unsafe extern "C" {
    /// Initially `base` = `UNMAPPED_BASE`, `len` = 0 (see above).
    #[doc(hidden)]
    #[link_name = "__allocprof_sample_bounds"]
    pub safe static BOUNDS: Bounds;
}
static META: AtomicPtr<SlotMeta> = AtomicPtr::new(ptr::null_mut());
/// The ledger's record table, 0 if none (lazy mode commits its records).
static TABLE: AtomicUsize = AtomicUsize::new(0);
/// Index into `LAYOUTS` of the layout in use (valid once READY).
static LAYOUT: AtomicUsize = AtomicUsize::new(0);
/// `UNINIT`, `READY`, `FAILED`, or `INITIALISING | marker` (the address of
/// the initialising thread's fork marker page, 0 if it could not make one:
/// see [`initialise`]).
static STATE: AtomicU64 = AtomicU64::new(UNINIT);
/// Region, side table and ledger table reserved PROT_NONE (strict
/// overcommit): each class's open prefix is committed by mprotect.
static LAZY: AtomicBool = AtomicBool::new(false);
const UNINIT: u64 = 0;
const INITIALISING: u64 = 1;
const READY: u64 = 2;
const FAILED: u64 = 3;

/// Whether `p` is (inside) the sample region. The only check on the
/// unsampled free path: two loads of read-mostly words on one cache line
/// and a compare.
#[inline(always)]
pub fn contains(p: *const u8) -> bool {
    let (off, len): (usize, usize);
    // SAFETY: reads the two aligned words of `BOUNDS` rip-relative (a plain
    // `.load()` would go through the GOT from another crate, see
    // `load_relaxed_direct!`); aligned 8-byte loads are atomic on x86_64.
    // `off` = p - base with base as a memory operand (one load fewer).
    unsafe {
        core::arch::asm!(
            "sub {o}, qword ptr [rip + {s}]",
            "mov {l}, qword ptr [rip + {s} + 8]",
            o = inout(reg) p as usize => off,
            l = out(reg) len,
            s = sym BOUNDS,
            options(readonly, nostack),
        );
    }
    off < len
}

/// The region's address range and whether it runs in lazy mode, once it
/// exists.
pub fn bounds() -> Option<(usize, usize, bool)> {
    (STATE.load(Ordering::Acquire) == READY).then(|| {
        (
            BOUNDS.base.load(Ordering::Relaxed),
            BOUNDS.len.load(Ordering::Relaxed),
            LAZY.load(Ordering::Relaxed),
        )
    })
}

/// Where a placed slot came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Warm,
    Cold,
    Bump,
}

/// Place a block of `size` bytes aligned to `align` (a power of two),
/// recording `weight`; with `zero`, its usable bytes ([`usable_size`]) read
/// as zero, like glibc's calloc, which clears the whole chunk. A full class
/// spills into larger ones. `None` if the region is unavailable or has no
/// fitting free slot, or (lazy mode only) the kernel refuses to commit it.
/// May change errno.
pub fn alloc(size: usize, align: usize, weight: u64, zero: bool) -> Option<*mut u8> {
    let pages = pages_for(size);
    let first = class_for(pages, align)?;
    let (base, meta, l) = ensure_mapped()?;
    for k in first..l.classes {
        let c = &CLASSES[k];
        let (idx, source) = if let Some(i) = pop(&c.warm, meta, l, k) {
            // Still counted warm until placed (below): count >= stack.
            (i, Source::Warm)
        } else if let Some(i) = pop(&c.cold, meta, l, k) {
            (i, Source::Cold)
        } else if let Some(i) = bump(l, k) {
            (i, Source::Bump)
        } else {
            continue; // spill into the next class
        };
        if let Err(records_open) = open_prefix(base, meta, l, k, idx) {
            // Lazy mode at the commit limit. Give the slot back where it
            // came from (a fresh one only if its side-table record is
            // writable; else it is given up: a slot of address space)
            // and let the caller report the sample unplaced.
            match source {
                Source::Warm => push(&c.warm, meta, l, k, idx),
                Source::Cold => push(&c.cold, meta, l, k, idx),
                Source::Bump if records_open => push(&c.cold, meta, l, k, idx),
                Source::Bump => {}
            }
            return None;
        }
        if source == Source::Bump {
            // After the prefix opened: a reader of `USED[k]` records finds
            // them all readable.
            crate::ledger::note_used(k, idx);
        }
        return Some(occupy(base, meta, l, (k, idx), source, size, weight, zero));
    }
    None
}

/// An unsampled block of `size` bytes aligned to `align` (with `zero`,
/// cleared as in [`alloc`]) in a warm slot of its class, if the class has
/// one; else `None` (the caller asks the backend). For big blocks
/// (`sampler::BIG_BLOCK` and up): a churn whose blocks are nearly all
/// sampled then writes one buffer, not the region's and, for the few
/// unsampled ones, the backend's in turn. Warm slots only: such a block
/// never creates the region, grows a class's open prefix (nor its commit
/// charge), nor makes a syscall, and what the region holds stays bounded
/// by what samples used. `free` recognises it by its address and its
/// slot's state: no probe, no ledger record.
pub fn alloc_unsampled(size: usize, align: usize, zero: bool) -> Option<*mut u8> {
    if STATE.load(Ordering::Acquire) != READY {
        return None;
    }
    let (base, meta, l) = ready();
    let k = class_for(pages_for(size), align).filter(|&k| k < l.classes)?;
    let idx = pop(&CLASSES[k].warm, meta, l, k)?;
    // A warm slot lies in its class's open prefix: dumped, and committed
    // in lazy mode.
    Some(occupy(base, meta, l, (k, idx), Source::Warm, size, 0, zero))
}

/// Hand slot `idx` of class `k` (taken from `source`, in the open prefix)
/// to a block of `size` bytes: live, sampled with `weight` or unsampled
/// (`weight` 0). Returns its address.
#[allow(clippy::too_many_arguments)]
fn occupy(
    base: usize,
    meta: *mut SlotMeta,
    l: &Layout,
    (k, idx): (usize, usize),
    source: Source,
    size: usize,
    weight: u64,
    zero: bool,
) -> *mut u8 {
    let c = &CLASSES[k];
    let pages = pages_for(size);
    let addr = base + l.offset[k] + idx * slot_bytes(k);
    let m = slot_meta(meta, l, k, idx);
    m.size.store(size, Ordering::Relaxed);
    m.weight.store(weight, Ordering::Relaxed);
    m.state.store(
        if weight == 0 { UNSAMPLED } else { LIVE },
        Ordering::Relaxed,
    );
    let dirty = m.dirty_pages.load(Ordering::Relaxed);
    if (pages as u32) > dirty {
        m.dirty_pages.store(pages as u32, Ordering::Relaxed);
    }
    // One more live, and for a warm slot one less warm (it was
    // counted since its pop, so the subtraction does not borrow).
    let delta = match source {
        Source::Warm => ONE_LIVE - ONE_WARM,
        Source::Cold | Source::Bump => ONE_LIVE,
    };
    c.counts.fetch_add(delta, Ordering::Relaxed);
    if source == Source::Warm {
        if k >= FIRST_BIG_CLASS {
            WARM_BIG.fetch_sub(dirty as usize * PAGE, Ordering::Relaxed);
        }
        if zero {
            // Only the slot's formerly dirty pages can hold stale
            // bytes; the rest of the block's pages read as zero.
            let stale = pages.min(dirty as usize) * PAGE;
            // SAFETY: the block's `pages` whole pages lie in its slot,
            // which we own and which is readable and writable
            // (committed by `open_prefix` in lazy mode).
            unsafe { ptr::write_bytes(addr as *mut u8, 0, stale) };
        }
    }
    addr as *mut u8
}

/// Make sure slot `idx` of class `k` lies in the class's open prefix,
/// growing it by whole chunks from its current end (so it stays one
/// contiguous range: at most two VMAs per class): `MADV_DODUMP`, so live
/// samples are in core dumps, and in lazy mode first `mprotect` of the
/// slots' side-table and ledger records, then of the slots. Racing threads
/// may open the same pages twice, which is harmless. `Err(records_open)`
/// if the kernel refused a commit (lazy mode only), saying whether the
/// slot's side-table record is writable.
fn open_prefix(
    base: usize,
    meta: *mut SlotMeta,
    l: &Layout,
    k: usize,
    idx: usize,
) -> Result<(), bool> {
    let prefix = &CLASSES[k].prefix;
    let done = prefix.load(Ordering::Acquire);
    if idx < done {
        return Ok(());
    }
    let chunk = (COMMIT_CHUNK / slot_bytes(k)).max(1);
    let want = (idx + 1).next_multiple_of(chunk).min(l.slots[k]);
    let start = base + l.offset[k] + done * slot_bytes(k);
    let len = (want - done) * slot_bytes(k);
    if LAZY.load(Ordering::Relaxed) {
        let (first, end) = (l.id_base[k] + done, l.id_base[k] + want);
        let meta = meta as usize;
        if !commit(
            meta + first * size_of::<SlotMeta>(),
            meta + end * size_of::<SlotMeta>(),
        ) {
            return Err(false);
        }
        let table = TABLE.load(Ordering::Relaxed);
        if table != 0
            && !commit(
                table + crate::ledger::table_bytes(first),
                table + crate::ledger::table_bytes(end),
            )
        {
            return Err(true);
        }
        if !commit(start, start + len) {
            return Err(true);
        }
    }
    // SAFETY: advice on slots of our own reservation; it only changes
    // what a core dump holds. A failure (the kernel could not split the
    // VMA) leaves these slots out of core dumps, as before.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DODUMP) };
    prefix.fetch_max(want, Ordering::Release);
    Ok(())
}

/// Lazy mode: make the pages holding `[start, end)` (inside one of our
/// `PROT_NONE` reservations) readable and writable. Pages a racing commit
/// already opened keep their contents.
fn commit(start: usize, end: usize) -> bool {
    let lo = start & !(PAGE - 1);
    let hi = end.next_multiple_of(PAGE);
    // SAFETY: `[lo, hi)` lies inside the region, side table or ledger
    // table (whole pages of them); making it readable and writable only
    // adds access.
    let rc = unsafe {
        libc::mprotect(
            lo as *mut libc::c_void,
            hi - lo,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    rc == 0
}

/// Layout in use; only called once the region is READY.
fn current_layout() -> &'static Layout {
    &LAYOUTS[LAYOUT.load(Ordering::Relaxed)]
}

/// Size and weight recorded for the block at `p` (which must be a live
/// block returned by [`alloc`]).
pub fn block_info(p: *const u8) -> (usize, u64) {
    match locate(p) {
        Some((meta, l, k, idx, _)) => {
            let m = slot_meta(meta, l, k, idx);
            (
                m.size.load(Ordering::Relaxed),
                m.weight.load(Ordering::Relaxed),
            )
        }
        None => (0, 0),
    }
}

/// Index of the slot that starts at `p` in the side table (and the
/// ledger's record table); `None` if `p` starts no slot.
pub fn slot_id(p: *const u8) -> Option<usize> {
    let (_, l, k, idx, at_start) = locate(p)?;
    at_start.then(|| l.id_base[k] + idx)
}

/// Bytes usable at `p`: its whole pages.
pub fn usable_size(p: *const u8) -> usize {
    pages_for(block_info(p).0) * PAGE
}

/// Why [`claim`] refused a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadFree {
    /// The block at `p` is not live: freed already (or never placed).
    DoubleFree,
    /// `p` is in the region but not the start of a slot.
    InvalidPointer,
}

/// A live block [`claim`]ed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub size: usize,
    /// Placed by [`alloc`] (a sample), not [`alloc_unsampled`].
    pub sampled: bool,
}

/// First half of freeing `p` (in the region): mark its slot free, so a
/// second free of the same block is caught here.
pub fn claim(p: *const u8) -> Result<Claimed, BadFree> {
    let Some((meta, l, k, idx, at_start)) = locate(p) else {
        return Err(BadFree::InvalidPointer);
    };
    if !at_start {
        return Err(BadFree::InvalidPointer);
    }
    let m = slot_meta(meta, l, k, idx);
    // One swap: of two frees of a block, one finds it live.
    let sampled = match m.state.swap(FREE, Ordering::AcqRel) {
        LIVE => true,
        UNSAMPLED => false,
        _ => return Err(BadFree::DoubleFree),
    };
    Ok(Claimed {
        size: m.size.load(Ordering::Relaxed),
        sampled,
    })
}

/// Second half: give the slot of `p` (successfully [`claim`]ed) back. Keep
/// it warm if the class's cache has room (for the big classes: if the
/// process-wide [`WARM_BIG_BYTES`] has room for its resident pages), else
/// drop its pages (`MADV_DONTNEED`) and put it on the cold stack. May
/// change errno.
pub fn release(p: *mut u8) {
    let Some((meta, l, k, idx, _)) = locate(p) else {
        return;
    };
    let m = slot_meta(meta, l, k, idx);
    let c = &CLASSES[k];
    let dirty = m.dirty_pages.load(Ordering::Relaxed) as usize * PAGE;
    let reserved = k >= FIRST_BIG_CLASS && reserve_big(dirty);
    // One less live; one more warm if the limit (with the live samples
    // left) allows. One compare-exchange: a sample costs no more atomic
    // operations on the class than with a fixed limit.
    let mut cur = c.counts.load(Ordering::Relaxed);
    let keep = loop {
        let live = ((cur >> 32) as u32).wrapping_sub(1);
        let warm = cur as u32;
        let keep = reserved || warm < warm_limit_with_live(k, live);
        let new = (u64::from(live) << 32) | u64::from(warm + u32::from(keep));
        match c
            .counts
            .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => break keep,
            Err(v) => cur = v,
        }
    };
    if keep {
        push(&c.warm, meta, l, k, idx);
        return;
    }
    // SAFETY: `p` starts slot `idx`, which the caller gives up, and
    // `dirty` is at most the slot's size; this only drops that range's
    // pages.
    unsafe { libc::madvise(p.cast(), dirty, libc::MADV_DONTNEED) };
    m.dirty_pages.store(0, Ordering::Relaxed);
    push(&c.cold, meta, l, k, idx);
}

/// Books `bytes` of warm big slots against [`WARM_BIG_BYTES`]; false if
/// they do not fit.
fn reserve_big(bytes: usize) -> bool {
    WARM_BIG
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
            (cur + bytes <= WARM_BIG_BYTES).then_some(cur + bytes)
        })
        .is_ok()
}

/// Free `p` (a live block returned by [`alloc`] or [`alloc_unsampled`]):
/// [`claim`] + [`release`].
pub fn free(p: *mut u8) -> Result<Claimed, BadFree> {
    let claimed = claim(p)?;
    release(p);
    Ok(claimed)
}

/// (side table, layout, class, slot index, `p` is the slot's start) for a
/// pointer in the region; `None` if it is in no slot ever placed
/// (alignment padding, beyond the class's open prefix) or the region does
/// not exist.
fn locate(p: *const u8) -> Option<(*mut SlotMeta, &'static Layout, usize, usize, bool)> {
    if STATE.load(Ordering::Acquire) != READY {
        return None;
    }
    let l = current_layout();
    let off = (p as usize).wrapping_sub(BOUNDS.base.load(Ordering::Relaxed));
    let meta = META.load(Ordering::Relaxed);
    // Class offsets ascend: the class is the last one starting at or
    // before `off` (a binary search; a linear scan from the top cost ~200
    // instructions per call for the small classes, twice per sampled free).
    // Past that class's slots is alignment padding: in no slot.
    let k = l.offset[..l.classes]
        .partition_point(|&o| o <= off)
        .checked_sub(1)?;
    let rel = off - l.offset[k];
    let idx = rel >> (PAGE_SHIFT as usize + k);
    // Past the open prefix no slot was ever placed (and in lazy mode its
    // side-table record is not even readable).
    (idx < CLASSES[k].prefix.load(Ordering::Acquire))
        .then(|| (meta, l, k, idx, rel & (slot_bytes(k) - 1) == 0))
}

/// Map the region and side table on first use. Never waits: a thread that
/// finds another one mid-initialisation gets `None` (an unplaced sample)
/// rather than spinning, which could deadlock a signal handler.
#[inline]
fn ensure_mapped() -> Option<(usize, *mut SlotMeta, &'static Layout)> {
    if STATE.load(Ordering::Acquire) == READY {
        return Some(ready());
    }
    initialise()
}

/// The first use, or a thread that finds the region initialising. The
/// initialising state names a `MADV_WIPEONFORK` page holding a non-zero
/// word ([`mapping::fork_marker`]): a thread that finds the word zero is
/// in a fork child (or grandchild) forked in the middle of the work, and
/// the thread doing it does not exist there, so it takes the work over,
/// after dropping what the ancestor had mapped (its own copies), instead of
/// every sample waiting forever. A process sharing our memory without
/// being a thread of ours (`clone(CLONE_VM)`) sees the word set and leaves
/// the work alone, as does every thread of ours.
#[cold]
#[inline(never)]
fn initialise() -> Option<(usize, *mut SlotMeta, &'static Layout)> {
    let s = STATE.load(Ordering::Acquire);
    match s {
        READY => return Some(ready()),
        FAILED => return None,
        UNINIT => {}
        _ => {
            let marker = (s & !(PAGE as u64 - 1)) as usize;
            // SAFETY: a marker page is never unmapped; its first word is
            // only accessed atomically.
            let busy = marker == 0
                || unsafe { &*(marker as *const AtomicU64) }.load(Ordering::Acquire) != 0;
            if busy {
                return None; // in progress in this address space
            }
        }
    }
    let marker = mapping::fork_marker();
    let mine = INITIALISING | marker.unwrap_or(0) as u64;
    if STATE
        .compare_exchange(s, mine, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        if let Some(m) = marker {
            mapping::drop_marker(m);
        }
        return (STATE.load(Ordering::Acquire) == READY).then(ready);
    }
    if s != UNINIT {
        // Forked while an ancestor was initialising: nothing was placed
        // yet (placement waits for READY), so what it had mapped is
        // dropped and the work done afresh.
        BOUNDS.len.store(0, Ordering::Release);
        BOUNDS.base.store(UNMAPPED_BASE, Ordering::Release);
        mapping::abandon_partial();
    }
    match map_region() {
        Some(r) => {
            let l = &LAYOUTS[r.layout];
            crate::ledger::setup(
                r.table,
                l.total_slots,
                r.base,
                l.len,
                &l.id_base[..l.classes],
            );
            LAYOUT.store(r.layout, Ordering::Relaxed);
            LAZY.store(r.lazy, Ordering::Relaxed);
            TABLE.store(r.table, Ordering::Relaxed);
            META.store(r.meta, Ordering::Release);
            BOUNDS.len.store(LAYOUTS[r.layout].len, Ordering::Release);
            BOUNDS.base.store(r.base, Ordering::Release);
            STATE.store(READY, Ordering::Release);
            Some(ready())
        }
        None => {
            warn(b"allocprof: cannot reserve address space for the sample region (RLIMIT_AS or address space exhausted); sampled allocations are reported as unplaced\n");
            STATE.store(FAILED, Ordering::Release);
            None
        }
    }
}

fn ready() -> (usize, *mut SlotMeta, &'static Layout) {
    (
        BOUNDS.base.load(Ordering::Relaxed),
        META.load(Ordering::Relaxed),
        current_layout(),
    )
}
