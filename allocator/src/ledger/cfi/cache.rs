//! The unwind rows of return addresses seen before, for all threads.
//!
//! Finding an FDE and running its CFA program costs ≈ 2,800 instructions
//! a frame (callgrind, cc1's stacks), and a program's samples come from a
//! few thousand call sites: without the cache the unwinder's time budget
//! (`stack::UNWIND_COST_FACTOR`) was ≈ 1.3% of cc1's instructions. A hit is
//! a few dozen.
//!
//! * Direct-mapped, [`ENTRIES`] entries of one cache line each, in `.bss`
//!   (untouched entries cost no memory). A colliding row replaces the old.
//! * Lock-free: each entry is a seqlock whose writer claims it with a
//!   compare-and-swap and gives up if another holds it (a signal handler
//!   interrupting a write on the same thread included); a reader that sees
//!   it odd or changed misses. Nothing waits.
//! * A hit is checked against the current object's CFI: the entry keeps
//!   the address of the FDE the row came from and a print of its bytes
//!   (its length and CIE pointer, and a hash of the rest: the pc range it
//!   covers and its CFA program), read again inside the object's
//!   `.eh_frame_hdr` segment before the row is used. An object unloaded and
//!   another loaded at its address with other CFI there then misses.

use core::sync::atomic::{AtomicU64, Ordering, fence};

use super::fde::{Row, Rule, find_fde, row_for};
use super::read::Mem;

/// Entries (a power of two): 256 KiB of address space, of which a program
/// touches a page per 64 call sites it samples.
const ENTRIES: usize = 4096;

/// FDEs longer than this are not cached (bounded work per hit; an FDE is
/// typically 20–60 bytes).
const MAX_FDE_BYTES: usize = 256;

#[repr(C, align(64))]
struct Entry {
    /// Even: stable; odd: being written.
    seq: AtomicU64,
    /// The return address minus one; 0: empty.
    at: AtomicU64,
    fde: AtomicU64,
    /// [`fde_print`] of the FDE.
    print: [AtomicU64; 2],
    /// The row, packed by [`pack`].
    row: [AtomicU64; 3],
}

impl Entry {
    const fn empty() -> Entry {
        Entry {
            seq: AtomicU64::new(0),
            at: AtomicU64::new(0),
            fde: AtomicU64::new(0),
            print: [const { AtomicU64::new(0) }; 2],
            row: [const { AtomicU64::new(0) }; 3],
        }
    }
}

static CACHE: [Entry; ENTRIES] = [const { Entry::empty() }; ENTRIES];

pub(super) fn slot_index(at: usize) -> usize {
    ((at as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - ENTRIES.trailing_zeros())) as usize
}

/// The unwind row at `at` (a return address minus one) in the object whose
/// `.eh_frame_hdr` is `hdr`, its CFI read inside `mem`: from the cache, or
/// found and decoded (then cached).
pub(crate) fn row_at(mem: Mem, hdr: usize, at: usize) -> Option<Row> {
    let e = &CACHE[slot_index(at)];
    if let Some(row) = lookup(e, mem, at) {
        return Some(row);
    }
    let fde = find_fde(mem, hdr, at)?;
    let row = row_for(mem, fde, at)?;
    if let (Some(print), Some(packed)) = (fde_print(mem, fde), pack(&row)) {
        store(e, at, fde, print, packed);
    }
    Some(row)
}

fn lookup(e: &Entry, mem: Mem, at: usize) -> Option<Row> {
    let seq = e.seq.load(Ordering::Acquire);
    if seq & 1 != 0 {
        return None;
    }
    let key = e.at.load(Ordering::Relaxed);
    let fde = e.fde.load(Ordering::Relaxed) as usize;
    let print = [
        e.print[0].load(Ordering::Relaxed),
        e.print[1].load(Ordering::Relaxed),
    ];
    let packed = [
        e.row[0].load(Ordering::Relaxed),
        e.row[1].load(Ordering::Relaxed),
        e.row[2].load(Ordering::Relaxed),
    ];
    fence(Ordering::Acquire);
    // Empty entries hold 0, never a return address minus one.
    if e.seq.load(Ordering::Relaxed) != seq || key != at as u64 {
        return None;
    }
    (fde_print(mem, fde)? == print).then(|| unpack(packed))
}

fn store(e: &Entry, at: usize, fde: usize, print: [u64; 2], packed: [u64; 3]) {
    let seq = e.seq.load(Ordering::Relaxed);
    if seq & 1 != 0
        || e.seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    // The fields may be read while they change: the reader checks `seq`.
    fence(Ordering::Release);
    e.at.store(at as u64, Ordering::Relaxed);
    e.fde.store(fde as u64, Ordering::Relaxed);
    for (w, v) in e.print.iter().zip(print) {
        w.store(v, Ordering::Relaxed);
    }
    for (w, v) in e.row.iter().zip(packed) {
        w.store(v, Ordering::Relaxed);
    }
    e.seq.store(seq + 2, Ordering::Release);
}

/// The FDE at `fde`, read inside `mem`: its first word (length and CIE
/// pointer) and a hash of the rest, 8 bytes at a time (the last 8 bytes
/// overlapping the word before them). `None` if it lies outside `mem` or
/// is longer than [`MAX_FDE_BYTES`].
pub(super) fn fde_print(mem: Mem, fde: usize) -> Option<[u64; 2]> {
    let word = |at: usize| mem.read::<8>(at).map(u64::from_le_bytes);
    let first = word(fde)?;
    let len = first as u32 as usize;
    if !(8..=MAX_FDE_BYTES).contains(&len) {
        return None;
    }
    let end = fde + 4 + len;
    let mut hash = 0u64;
    let mut at = fde + 8;
    while at < end {
        let w = word(at.min(end - 8))?;
        hash = (hash.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
        at += 8;
    }
    Some([first, hash])
}

/// A rule as (kind, offset); `None` if its offset needs more than 32 bits.
fn rule_bits(r: Rule) -> Option<(u64, i32)> {
    Some(match r {
        Rule::Same => (0, 0),
        Rule::Undefined => (1, 0),
        Rule::At(off) => (2, i32::try_from(off).ok()?),
        Rule::Unknown => (3, 0),
    })
}

fn rule_from(kind: u64, off: i32) -> Rule {
    match kind {
        0 => Rule::Same,
        1 => Rule::Undefined,
        2 => Rule::At(i64::from(off)),
        _ => Rule::Unknown,
    }
}

/// `[cfa_off, rbp offset | ra offset << 32, cfa_reg | rbp kind << 32 |
/// ra kind << 40 | cfa_unknown << 48]`; `None` for a row that does not fit
/// (it is then not cached).
pub(super) fn pack(row: &Row) -> Option<[u64; 3]> {
    let (rbp_kind, rbp_off) = rule_bits(row.rbp)?;
    let (ra_kind, ra_off) = rule_bits(row.ra)?;
    let reg = u32::try_from(row.cfa_reg).ok()?;
    Some([
        row.cfa_off as u64,
        u64::from(rbp_off as u32) | u64::from(ra_off as u32) << 32,
        u64::from(reg) | rbp_kind << 32 | ra_kind << 40 | u64::from(row.cfa_unknown) << 48,
    ])
}

pub(super) fn unpack(w: [u64; 3]) -> Row {
    Row {
        cfa_reg: w[2] & 0xffff_ffff,
        cfa_off: w[0] as i64,
        cfa_unknown: (w[2] >> 48) & 1 != 0,
        rbp: rule_from((w[2] >> 32) & 0xff, w[1] as u32 as i32),
        ra: rule_from((w[2] >> 40) & 0xff, (w[1] >> 32) as u32 as i32),
    }
}
