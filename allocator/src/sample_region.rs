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
//! syscall: its pages are committed by the first touch, like any fresh
//! anonymous memory, and it is one VMA however many slots are live (no
//! `vm.max_map_count` exposure). The region is `MADV_DONTDUMP` (sampled
//! blocks are a sliver of the heap; a core dump of 100 GiB of mostly zero
//! pages helps nobody) and `MADV_NOHUGEPAGE` (under THP `always` a 4 KiB
//! slot could otherwise pin a 2 MiB page).
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
//! Double free: each slot has a live/free state that `free` flips with a
//! CAS, so freeing a block twice is caught before its slot could be pushed
//! twice (which would link the stack to itself and hand the same pointer to
//! two callers); the caller aborts, as glibc does.
//!
//! Strict overcommit (`vm.overcommit_memory = 2` ignores `MAP_NORESERVE`,
//! so a large writable reservation fails): the region is then reserved
//! `PROT_NONE` and runs in *lazy* mode, where each class has a committed
//! (`PROT_READ | PROT_WRITE`) prefix of slots that placement grows by
//! `mprotect` in chunks of [`COMMIT_CHUNK`] bytes (at least one slot). The
//! prefix never shrinks (cold release only drops pages), so the region is
//! at most two VMAs per class however many samples are live: no
//! `vm.max_map_count` exposure in this mode either. Its commit charge is
//! the classes' high-water marks.
//!
//! Lock-free throughout: a signal handler or fork child can never find a
//! lock held.
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
/// Slot classes: `PAGE << k` for k in `0..CLASS_COUNT` (4 KiB .. 4 GiB).
pub const CLASS_COUNT: usize = 21;
/// Largest slot of the full layout.
pub const MAX_SLOT: usize = slot_bytes(CLASS_COUNT - 1);
/// Alignment of the region base and of every class base from 128 MiB
/// slots up: the largest alignment a sampled block can get.
pub const MAX_ALIGN: usize = 128 << 20;
/// Address space of each class up to 128 MiB slots in the full layout.
const SMALL_SPAN: usize = 4 << 30;
/// Most layouts tried, each half the previous one (shift 0 = full).
pub const LAYOUT_COUNT: usize = 10;
/// Lazy mode commits each class's prefix in steps of this many bytes.
pub const COMMIT_CHUNK: usize = 1 << 20;
/// Most freed slots a class keeps warm (pages resident).
pub const WARM_MAX_SLOTS: usize = 8;
/// Most slot capacity (bytes) a class keeps warm.
pub const WARM_MAX_BYTES: usize = 1 << 20;

/// Where each class lives in one candidate layout. All offsets are from
/// the region base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Classes present: `0..classes` (the largest are dropped first).
    pub classes: usize,
    pub offset: [usize; CLASS_COUNT],
    pub slots: [usize; CLASS_COUNT],
    /// Index of each class's first slot in the side table.
    id_base: [usize; CLASS_COUNT],
    /// Region bytes (a multiple of `MAX_ALIGN`).
    pub len: usize,
    pub total_slots: usize,
}

/// Layout `shift`: the full layout's class spans divided by `2^shift`,
/// keeping only classes whose slot is at most an eighth of what the small
/// classes get in all (so the big ones cannot crowd out the rest).
pub const fn layout(shift: usize) -> Layout {
    let mut l = Layout {
        classes: 0,
        offset: [0; CLASS_COUNT],
        slots: [0; CLASS_COUNT],
        id_base: [0; CLASS_COUNT],
        len: 0,
        total_slots: 0,
    };
    let biggest = ((16 * SMALL_SPAN) >> shift) / 8;
    let mut end: usize = 0;
    let mut k = 0;
    while k < CLASS_COUNT && slot_bytes(k) <= biggest {
        let slot = slot_bytes(k);
        let full = if 4 * slot > SMALL_SPAN {
            4 * slot
        } else {
            SMALL_SPAN
        };
        let span = if full >> shift > slot {
            full >> shift
        } else {
            slot
        };
        let align = if slot < MAX_ALIGN { slot } else { MAX_ALIGN };
        let off = end.next_multiple_of(align);
        l.offset[k] = off;
        l.slots[k] = span / slot;
        l.id_base[k] = l.total_slots;
        l.total_slots += l.slots[k];
        end = off + span;
        k += 1;
    }
    l.classes = k;
    l.len = end.next_multiple_of(MAX_ALIGN);
    l
}

const LAYOUTS: [Layout; LAYOUT_COUNT] = {
    let mut a = [layout(0); LAYOUT_COUNT];
    let mut s = 1;
    while s < LAYOUT_COUNT {
        a[s] = layout(s);
        s += 1;
    }
    a
};

/// The largest region ever used: before the region exists, `BASE` sits
/// this far below the top of the address space (kernel half), so
/// `p - BASE < LEN` is false for every user pointer and NULL whichever of
/// BASE and LEN a racing reader sees first.
const MAX_REGION_LEN: usize = LAYOUTS[0].len;
const UNMAPPED_BASE: usize = 0usize.wrapping_sub(MAX_REGION_LEN);

static BASE: AtomicUsize = AtomicUsize::new(UNMAPPED_BASE);
/// Region length; 0 until the region exists.
static LEN: AtomicUsize = AtomicUsize::new(0);
static META: AtomicPtr<SlotMeta> = AtomicPtr::new(ptr::null_mut());
/// Index into `LAYOUTS` of the layout in use (valid once READY).
static LAYOUT: AtomicUsize = AtomicUsize::new(0);
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Region reserved PROT_NONE (strict overcommit): commit by mprotect.
static LAZY: AtomicBool = AtomicBool::new(false);
const UNINIT: u8 = 0;
const INITIALISING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

/// Slot states (`SlotMeta::state`).
const FREE: u32 = 0;
const LIVE: u32 = 1;

#[repr(C)]
struct SlotMeta {
    size: AtomicUsize,
    weight: AtomicU64,
    /// Free-stack link: slot index + 1, 0 = end.
    next: AtomicU32,
    /// Pages of the slot that may be resident (high-water mark of the
    /// blocks placed since the slot was last released cold).
    dirty_pages: AtomicU32,
    /// `LIVE` from placement until `free` claims it back.
    state: AtomicU32,
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
    /// Lazy mode: slots `[0, committed)` are readable and writable.
    committed: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // only used to build CLASSES
const CLASS_INIT: Class = Class {
    warm: AtomicU64::new(0),
    cold: AtomicU64::new(0),
    warm_count: AtomicU32::new(0),
    bump: AtomicUsize::new(0),
    committed: AtomicUsize::new(0),
};
static CLASSES: [Class; CLASS_COUNT] = [CLASS_INIT; CLASS_COUNT];

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

/// Whether `p` is (inside) the sample region. The only check on the
/// unsampled free path: two loads of read-mostly globals on one cache line
/// and a compare.
#[inline(always)]
pub fn contains(p: *const u8) -> bool {
    (p as usize).wrapping_sub(load_relaxed_direct!(BASE => usize))
        < load_relaxed_direct!(LEN => usize)
}

/// The region's address range and whether it runs in lazy mode, once it
/// exists.
pub fn bounds() -> Option<(usize, usize, bool)> {
    (STATE.load(Ordering::Acquire) == READY).then(|| {
        (
            BASE.load(Ordering::Relaxed),
            LEN.load(Ordering::Relaxed),
            LAZY.load(Ordering::Relaxed),
        )
    })
}

/// Pages a block of `size` bytes occupies (at least one).
pub const fn pages_for(size: usize) -> usize {
    if size == 0 { 1 } else { size.div_ceil(PAGE) }
}

/// Smallest class for `pages` pages at `align`, or `None` if no class of
/// the full layout fits.
pub fn class_for(pages: usize, align: usize) -> Option<usize> {
    if align > MAX_ALIGN || pages > MAX_SLOT / PAGE {
        return None;
    }
    let by_size = pages.next_power_of_two().trailing_zeros() as usize;
    let by_align = if align > PAGE {
        (align.next_power_of_two().trailing_zeros() - PAGE_SHIFT) as usize
    } else {
        0
    };
    Some(by_size.max(by_align))
}

/// Where a placed slot came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Warm,
    Cold,
    Bump,
}

/// Place a block of `size` bytes aligned to `align` (a power of two),
/// recording `weight`; with `zero`, its `size` bytes read as zero. A full
/// class spills into larger ones. `None` if the region is unavailable or
/// has no fitting free slot, or (lazy mode only) the kernel refuses to
/// commit it. May change errno.
pub fn alloc(size: usize, align: usize, weight: u64, zero: bool) -> Option<*mut u8> {
    let pages = pages_for(size);
    let first = class_for(pages, align)?;
    let (base, meta, l) = ensure_mapped()?;
    for k in first..l.classes {
        let c = &CLASSES[k];
        let (idx, source) = if let Some(i) = pop(&c.warm, meta, l, k) {
            c.warm_count.fetch_sub(1, Ordering::Relaxed);
            (i, Source::Warm)
        } else if let Some(i) = pop(&c.cold, meta, l, k) {
            (i, Source::Cold)
        } else if let Some(i) = bump(l, k) {
            (i, Source::Bump)
        } else {
            continue; // spill into the next class
        };
        let addr = base + l.offset[k] + idx * slot_bytes(k);
        if LAZY.load(Ordering::Relaxed) && !commit(base, l, k, idx) {
            // Typically the commit limit. Give the slot back where it came
            // from and let the caller report the sample unplaced.
            match source {
                Source::Warm => {
                    c.warm_count.fetch_add(1, Ordering::Relaxed);
                    push(&c.warm, meta, l, k, idx);
                }
                Source::Cold | Source::Bump => push(&c.cold, meta, l, k, idx),
            }
            return None;
        }
        let m = slot_meta(meta, l, k, idx);
        m.size.store(size, Ordering::Relaxed);
        m.weight.store(weight, Ordering::Relaxed);
        m.state.store(LIVE, Ordering::Relaxed);
        let dirty = m.dirty_pages.load(Ordering::Relaxed);
        if (pages as u32) > dirty {
            m.dirty_pages.store(pages as u32, Ordering::Relaxed);
        }
        if zero && source == Source::Warm {
            // SAFETY: the block's `size` bytes lie in its slot, which we
            // own and which is readable and writable (committed above in
            // lazy mode, always otherwise).
            unsafe { ptr::write_bytes(addr as *mut u8, 0, size) };
        }
        return Some(addr as *mut u8);
    }
    None
}

/// Lazy mode: make sure slot `idx` of class `k` is in the class's committed
/// prefix, growing it by whole chunks from its current end (so it stays
/// one contiguous range: one VMA). Racing threads may mprotect the same
/// pages twice, which is harmless.
fn commit(base: usize, l: &Layout, k: usize, idx: usize) -> bool {
    let committed = &CLASSES[k].committed;
    let done = committed.load(Ordering::Acquire);
    if idx < done {
        return true;
    }
    let chunk = (COMMIT_CHUNK / slot_bytes(k)).max(1);
    let want = (idx + 1).next_multiple_of(chunk).min(l.slots[k]);
    let start = base + l.offset[k] + done * slot_bytes(k);
    // SAFETY: slots [done, want) of class k lie inside our reservation;
    // making them readable and writable only adds access (pages a racing
    // commit already opened keep their contents).
    let rc = unsafe {
        libc::mprotect(
            start as *mut libc::c_void,
            (want - done) * slot_bytes(k),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    if rc != 0 {
        return false;
    }
    committed.fetch_max(want, Ordering::Release);
    true
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

/// First half of freeing `p` (in the region): mark its slot free, so a
/// second free of the same block is caught here. Returns the block's size.
pub fn claim(p: *const u8) -> Result<usize, BadFree> {
    let Some((meta, l, k, idx, at_start)) = locate(p) else {
        return Err(BadFree::InvalidPointer);
    };
    if !at_start {
        return Err(BadFree::InvalidPointer);
    }
    let m = slot_meta(meta, l, k, idx);
    m.state
        .compare_exchange(LIVE, FREE, Ordering::AcqRel, Ordering::Relaxed)
        .map_err(|_| BadFree::DoubleFree)?;
    Ok(m.size.load(Ordering::Relaxed))
}

/// Second half: give the slot of `p` (successfully [`claim`]ed) back. Keep
/// it warm if the class's cache has room, else drop its pages
/// (`MADV_DONTNEED`) and put it on the cold stack. May change errno.
pub fn release(p: *mut u8) {
    let Some((meta, l, k, idx, _)) = locate(p) else {
        return;
    };
    let m = slot_meta(meta, l, k, idx);
    let c = &CLASSES[k];
    if c.warm_count.fetch_add(1, Ordering::Relaxed) < warm_limit(k) {
        push(&c.warm, meta, l, k, idx);
        return;
    }
    c.warm_count.fetch_sub(1, Ordering::Relaxed);
    let len = m.dirty_pages.load(Ordering::Relaxed) as usize * PAGE;
    // SAFETY: `p` starts slot `idx`, which the caller gives up, and `len`
    // is at most the slot's size; this only drops that range's pages.
    unsafe { libc::madvise(p.cast(), len, libc::MADV_DONTNEED) };
    m.dirty_pages.store(0, Ordering::Relaxed);
    push(&c.cold, meta, l, k, idx);
}

/// Free `p` (a live block returned by [`alloc`]): [`claim`] + [`release`].
/// Returns the block's size.
pub fn free(p: *mut u8) -> Result<usize, BadFree> {
    let size = claim(p)?;
    release(p);
    Ok(size)
}

/// (side table, layout, class, slot index, `p` is the slot's start) for a
/// pointer in the region; `None` if it is in no slot (alignment padding)
/// or the region does not exist.
fn locate(p: *const u8) -> Option<(*mut SlotMeta, &'static Layout, usize, usize, bool)> {
    if STATE.load(Ordering::Acquire) != READY {
        return None;
    }
    let l = current_layout();
    let off = (p as usize).wrapping_sub(BASE.load(Ordering::Relaxed));
    let meta = META.load(Ordering::Relaxed);
    (0..l.classes).rev().find_map(|k| {
        let rel = off.checked_sub(l.offset[k])?;
        let idx = rel >> (PAGE_SHIFT as usize + k);
        (idx < l.slots[k]).then(|| (meta, l, k, idx, rel & (slot_bytes(k) - 1) == 0))
    })
}

fn slot_meta<'a>(meta: *mut SlotMeta, l: &Layout, k: usize, idx: usize) -> &'a SlotMeta {
    debug_assert!(k < l.classes && idx < l.slots[k]);
    // SAFETY: the side table has `l.total_slots` entries, mapped for the
    // life of the process; every field is atomic, so shared references are
    // fine.
    unsafe { &*meta.add(l.id_base[k] + idx) }
}

fn pop(head: &AtomicU64, meta: *mut SlotMeta, l: &Layout, k: usize) -> Option<usize> {
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

fn push(head: &AtomicU64, meta: *mut SlotMeta, l: &Layout, k: usize, idx: usize) {
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

fn bump(l: &Layout, k: usize) -> Option<usize> {
    let b = &CLASSES[k].bump;
    // Load first so a full class is not bumped forever.
    if b.load(Ordering::Relaxed) >= l.slots[k] {
        return None;
    }
    let idx = b.fetch_add(1, Ordering::Relaxed);
    (idx < l.slots[k]).then_some(idx)
}

/// Map the region and side table on first use. Never waits: a thread that
/// finds another one mid-initialisation gets `None` (an unplaced sample)
/// rather than spinning, which could deadlock a signal handler.
fn ensure_mapped() -> Option<(usize, *mut SlotMeta, &'static Layout)> {
    match STATE.load(Ordering::Acquire) {
        READY => return Some(ready()),
        UNINIT => {}
        _ => return None,
    }
    if STATE
        .compare_exchange(UNINIT, INITIALISING, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        return (STATE.load(Ordering::Acquire) == READY).then(ready);
    }
    match map_region() {
        Some(r) => {
            LAYOUT.store(r.layout, Ordering::Relaxed);
            LAZY.store(r.lazy, Ordering::Relaxed);
            META.store(r.meta, Ordering::Release);
            LEN.store(LAYOUTS[r.layout].len, Ordering::Release);
            BASE.store(r.base, Ordering::Release);
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
        BASE.load(Ordering::Relaxed),
        META.load(Ordering::Relaxed),
        current_layout(),
    )
}

fn warn(msg: &[u8]) {
    // SAFETY: writes our own buffer to stderr; the result does not matter.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
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

/// Bytes of address space the region (plus side table) may take: no limit
/// without `RLIMIT_AS`, else a quarter of the limit and at most half of
/// what the process has not used yet (the rest of the program needs room).
fn address_space_budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes the limit into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return usize::MAX;
    }
    let limit = lim.rlim_cur as usize;
    let free = limit.saturating_sub(vm_size());
    (limit / 4).min(free / 2)
}

/// This process's address space size in bytes (`/proc/self/statm`'s first
/// field), 0 if unknown. No allocation: a stack buffer and raw syscalls.
fn vm_size() -> usize {
    // SAFETY: opens a proc file read-only with a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 0;
    }
    let mut buf = [0u8; 64];
    // SAFETY: reads at most buf.len() bytes into buf; closes our own fd.
    let n = unsafe {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let n = usize::try_from(n).unwrap_or(0);
    buf[..n]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0usize, |acc, b| {
            acc.saturating_mul(10).saturating_add(usize::from(b - b'0'))
        })
        .saturating_mul(PAGE)
}

struct Mapped {
    base: usize,
    meta: *mut SlotMeta,
    layout: usize,
    lazy: bool,
}

/// Test builds only: `ALLOCPROF_TEST_FORCE_LAZY=1` makes the region lazy
/// as under strict overcommit. Not compiled into any library.
#[cfg(test)]
fn force_lazy() -> bool {
    std::env::var_os("ALLOCPROF_TEST_FORCE_LAZY").is_some()
}
#[cfg(not(test))]
fn force_lazy() -> bool {
    false
}

/// Reserve the largest layout that fits the address-space budget and that
/// the kernel grants (writable; `PROT_NONE` + lazy mode if the kernel
/// refuses a writable reservation of that size but not an inaccessible
/// one), plus its side table.
fn map_region() -> Option<Mapped> {
    let budget = address_space_budget();
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    for (i, l) in LAYOUTS.iter().enumerate() {
        let meta_len = (l.total_slots * size_of::<SlotMeta>()).next_multiple_of(PAGE);
        let reserve = l.len + MAX_ALIGN;
        if reserve + meta_len > budget {
            continue;
        }
        let writable = if force_lazy() {
            None
        } else {
            map_anon(reserve, rw)
        };
        let (raw, lazy) = match writable {
            Some(raw) => (raw, false),
            None => match map_anon(reserve, libc::PROT_NONE) {
                Some(raw) => (raw, true),
                None => continue, // not enough address space: smaller
            },
        };
        let base = raw.next_multiple_of(MAX_ALIGN);
        // SAFETY: trims the unaligned head and tail of our own reservation.
        unsafe {
            if base > raw {
                libc::munmap(raw as *mut libc::c_void, base - raw);
            }
            let end = base + l.len;
            let raw_end = raw + reserve;
            if raw_end > end {
                libc::munmap(end as *mut libc::c_void, raw_end - end);
            }
        }
        // Zero pages are a valid all-empty side table (atomics of 0).
        let Some(meta) = map_anon(meta_len, rw) else {
            // SAFETY: releases the reservation made above.
            unsafe { libc::munmap(base as *mut libc::c_void, l.len) };
            continue;
        };
        // SAFETY: advice and names on our own anonymous mappings. Failures
        // are harmless and ignored: DONTDUMP/NOHUGEPAGE only keep dumps
        // small and slots from pinning huge pages; naming needs
        // CONFIG_ANON_VMA_NAME.
        unsafe {
            libc::madvise(base as *mut libc::c_void, l.len, libc::MADV_DONTDUMP);
            libc::madvise(base as *mut libc::c_void, l.len, libc::MADV_NOHUGEPAGE);
            libc::madvise(meta as *mut libc::c_void, meta_len, libc::MADV_DONTDUMP);
            libc::prctl(
                PR_SET_VMA,
                PR_SET_VMA_ANON_NAME,
                base as libc::c_ulong,
                l.len as libc::c_ulong,
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
        return Some(Mapped {
            base,
            meta: meta as *mut SlotMeta,
            layout: i,
            lazy,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_layouts() {
        assert_eq!(class_for(1, 16), Some(0));
        assert_eq!(class_for(2, 16), Some(1));
        assert_eq!(class_for(3, 16), Some(2));
        assert_eq!(class_for(1, 8192), Some(1));
        assert_eq!(class_for(1, MAX_ALIGN), Some(15));
        assert_eq!(class_for(1, MAX_ALIGN * 2), None);
        assert_eq!(class_for(MAX_SLOT / PAGE, 16), Some(CLASS_COUNT - 1));
        assert_eq!(class_for(MAX_SLOT / PAGE + 1, 16), None);
        let full = layout(0);
        assert_eq!(full.classes, CLASS_COUNT);
        assert_eq!(full.len, 100 << 30);
        assert_eq!(full.slots[10], 1024); // 4 MiB slots
        assert_eq!(full.slots[16], 16); // 256 MiB
        assert_eq!(full.slots[18], 4); // 1 GiB
        assert_eq!(full.slots[20], 4); // 4 GiB
        for (s, l) in LAYOUTS.iter().enumerate() {
            assert!(l.classes >= 12, "layout {s}");
            if s > 0 {
                assert!(l.len < LAYOUTS[s - 1].len, "layout {s} shrinks");
            }
            assert_eq!(l.len % MAX_ALIGN, 0);
            for k in 0..l.classes {
                assert!(l.slots[k] >= 1);
                assert_eq!(l.offset[k] % slot_bytes(k).min(MAX_ALIGN), 0);
                let end = l.offset[k] + l.slots[k] * slot_bytes(k);
                assert!(end <= l.len);
                if k + 1 < l.classes {
                    assert!(end <= l.offset[k + 1], "layout {s} class {k}");
                }
            }
        }
        // Under `ulimit -v 8000000` (a quarter: ~1.9 GiB) a layout with
        // every class up to 128 MiB still fits.
        let fits = LAYOUTS
            .iter()
            .find(|l| l.len + MAX_ALIGN < 1900 << 20)
            .unwrap();
        assert_eq!(fits.classes, 16);
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

    /// Runs test `name` again in a child process with `env` set, for tests
    /// that need a region in another mode or with class state of their own
    /// (the region is process-wide, and the harness runs tests in
    /// parallel). Returns true in the child.
    fn in_child(name: &str, env: &str) -> bool {
        if std::env::var_os(env).is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(env, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child {name}: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }

    // All tests of the default region in one function: the region and its
    // caches are process-wide and the test harness runs tests in parallel.
    #[test]
    fn alloc_free_reuse_and_alignment() {
        let p = alloc(100, 16, 7, false).expect("placed");
        assert!(contains(p));
        assert_eq!(p as usize % PAGE, 0);
        assert_eq!(block_info(p), (100, 7));
        assert_eq!(usable_size(p), PAGE);
        // SAFETY: p has PAGE usable bytes.
        unsafe { p.write_bytes(0xab, PAGE) };
        assert_eq!(free(p), Ok(100));

        let q = alloc(3 * PAGE + 1, 1 << 20, 1, false).expect("placed");
        assert_eq!(q as usize % (1 << 20), 0);
        assert_eq!(usable_size(q), 4 * PAGE);
        assert_eq!(free(q), Ok(3 * PAGE + 1));
        assert_eq!(free(q), Err(BadFree::DoubleFree));
        // SAFETY: q + PAGE is inside q's slot.
        assert_eq!(free(unsafe { q.add(PAGE) }), Err(BadFree::InvalidPointer));
        assert!(alloc(MAX_SLOT + 1, 16, 1, false).is_none());
        assert!(alloc(PAGE, MAX_ALIGN * 2, 1, false).is_none());
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
            free(b).unwrap();
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
            free(b).unwrap();
        }
    }

    /// Huge blocks get slots of their own, and a full class spills into
    /// larger ones: 4 x 256 MiB, 1 GiB, 3 GiB and 1,500 x 3 MiB (the 4 MiB
    /// class has 1,024 slots) are all placed at once. Nothing is touched,
    /// so this costs address space only.
    #[test]
    fn huge_blocks_and_full_classes_are_placed() {
        if !in_child(
            "sample_region::tests::huge_blocks_and_full_classes_are_placed",
            "ALLOCPROF_TEST_HUGE",
        ) {
            return;
        }
        let mut live = Vec::new();
        for size in [256 << 20, 256 << 20, 256 << 20, 256 << 20, 1 << 30, 3 << 30] {
            let p = alloc(size, 16, 1, false).unwrap_or_else(|| panic!("{size} placed"));
            assert!(contains(p));
            assert_eq!(block_info(p).0, size);
            live.push(p);
        }
        for i in 0..1500 {
            let p = alloc(3 << 20, 16, 1, false).unwrap_or_else(|| panic!("3 MiB #{i} placed"));
            assert!(contains(p));
            live.push(p);
        }
        let mut sorted = live.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), live.len(), "no slot handed out twice");
        for p in live {
            free(p).unwrap();
        }
    }

    /// Lazy mode (strict overcommit): thousands of live samples keep the
    /// region at a few VMAs per class.
    #[test]
    fn lazy_mode_keeps_vmas_bounded() {
        if !in_child(
            "sample_region::tests::lazy_mode_keeps_vmas_bounded",
            "ALLOCPROF_TEST_FORCE_LAZY",
        ) {
            return;
        }
        let maps = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .count()
        };
        let p = alloc(100, 16, 1, false).expect("placed");
        let (_, _, lazy) = bounds().unwrap();
        assert!(lazy, "ALLOCPROF_TEST_FORCE_LAZY must force lazy mode");
        let before = maps();
        let mut live = vec![p];
        for (i, size) in [
            (0usize, 100usize),
            (1, 5000),
            (2, 3 * PAGE),
            (3, 20_000),
            (6, 200_000),
        ]
        .iter()
        .flat_map(|&(k, size)| (0..(4000 >> k.min(3))).map(move |i| (i, size)))
        {
            let b = alloc(size, 16, 1, i % 2 == 0).expect("placed");
            // SAFETY: the block has `size` writable bytes.
            unsafe { b.write_bytes(0x11, size) };
            live.push(b);
        }
        // Free every other block, reuse, free all: cold releases must not
        // split the committed prefix either.
        for b in live.iter().skip(1).step_by(2) {
            free(*b).unwrap();
        }
        let after = maps();
        println!(
            "lazy: {} live samples, maps {before} -> {after}",
            live.len()
        );
        assert!(live.len() > 7000);
        assert!(
            after <= before + 2 * CLASS_COUNT,
            "lazy mode split the region: {before} -> {after} VMAs"
        );
        for b in live.iter().step_by(2) {
            free(*b).unwrap();
        }
    }
}
