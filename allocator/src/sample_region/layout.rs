//! Where the sample region's slot classes live: the candidate layouts, from
//! the full 100 GiB one down by powers of two, and which class a block of a
//! given size and alignment needs. Pure arithmetic, evaluated at compile time.

pub const PAGE: usize = 4096;
pub(super) const PAGE_SHIFT: u32 = 12;
/// Slot classes: `PAGE << k` for k in `0..CLASS_COUNT` (4 KiB .. 4 GiB).
pub const CLASS_COUNT: usize = 21;
/// Largest slot of the full layout.
pub const MAX_SLOT: usize = slot_bytes(CLASS_COUNT - 1);
/// Alignment of the region base and of every class base from 128 MiB
/// slots up: the largest alignment a sampled block can get.
pub const MAX_ALIGN: usize = 128 << 20;
/// Address space of each class up to 128 MiB slots in the full layout.
pub(super) const SMALL_SPAN: usize = 4 << 30;
/// Most layouts tried, each half the previous one (shift 0 = full).
pub const LAYOUT_COUNT: usize = 10;
/// Each class's open prefix (dumped; in lazy mode also committed) grows in
/// steps of this many bytes of slots (at least one slot).
pub const COMMIT_CHUNK: usize = 1 << 20;
/// Freed slots a class keeps warm (pages resident) whatever its live
/// samples: the fixed part of its warm limit (see [`warm_limit`]).
pub const WARM_MAX_SLOTS: usize = 32;
/// Most slot capacity (bytes) of the fixed part of a class's warm limit.
pub const WARM_MAX_BYTES: usize = 1 << 20;
/// The first class of big slots (2 MiB): these keep freed slots warm
/// within one process-wide budget of resident bytes, [`WARM_BIG_BYTES`],
/// instead of a per-class count.
pub const FIRST_BIG_CLASS: usize = 9;
/// Most resident bytes that freed slots of [`FIRST_BIG_CLASS`] and up keep
/// warm in all, process-wide. 64 MiB: a churn of blocks of up to 64 MiB
/// (one live at a time) reuses its slot without a fault, like glibc's own
/// retention of freed memory (its dynamic trim threshold tops out at
/// 64 MiB too).
pub const WARM_BIG_BYTES: usize = 64 << 20;

/// Where each class lives in one candidate layout. All offsets are from
/// the region base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Classes present: `0..classes` (the largest are dropped first).
    pub classes: usize,
    pub offset: [usize; CLASS_COUNT],
    pub slots: [usize; CLASS_COUNT],
    /// Index of each class's first slot in the side table.
    pub(super) id_base: [usize; CLASS_COUNT],
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

pub(super) const LAYOUTS: [Layout; LAYOUT_COUNT] = {
    let mut a = [layout(0); LAYOUT_COUNT];
    let mut s = 1;
    while s < LAYOUT_COUNT {
        a[s] = layout(s);
        s += 1;
    }
    a
};

/// Bytes per slot of class `k`.
pub const fn slot_bytes(k: usize) -> usize {
    PAGE << k
}

/// The fixed part of how many freed slots class `k` keeps warm:
/// [`WARM_MAX_SLOTS`], at most [`WARM_MAX_BYTES`] of slots (none from 2 MiB
/// slots up: those share [`WARM_BIG_BYTES`] instead). Classes of small
/// slots also keep one more per live sample they hold
/// ([`warm_limit_with_live`]).
pub const fn warm_limit(k: usize) -> u32 {
    let by_bytes = WARM_MAX_BYTES / slot_bytes(k);
    (if by_bytes < WARM_MAX_SLOTS {
        by_bytes
    } else {
        WARM_MAX_SLOTS
    }) as u32
}

/// How many freed slots class `k` keeps warm while it holds `live` live
/// samples: the fixed part, plus `live` for the classes of small slots
/// (those whose fixed part is the full [`WARM_MAX_SLOTS`]: up to 32 KiB).
///
/// Why the live part: in a steady churn the class's live samples wander
/// around their mean (a Poisson count, standard deviation √live), and every
/// free beyond the warm limit costs a `madvise(MADV_DONTNEED)` (in a
/// multi-threaded process a TLB shootdown on every other CPU) and, when the
/// slot is reused, page faults. With 8 fixed slots a 2-thread churn of
/// 8 B–16 KiB blocks released 1 freed sample in 13 this way, 9% of its
/// CPU time at the default rate. The live part absorbs that wander at any
/// heap size, and keeps what freed small samples retain proportional to
/// what live ones hold. Larger slots keep the fixed part only; from 2 MiB
/// up, the process-wide [`WARM_BIG_BYTES`] decides.
pub const fn warm_limit_with_live(k: usize, live: u32) -> u32 {
    let fixed = warm_limit(k);
    if fixed < WARM_MAX_SLOTS as u32 {
        fixed
    } else {
        fixed.saturating_add(live)
    }
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
