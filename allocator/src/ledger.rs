//! The live-sample ledger (layout: `profiler_common::ledger`): for every
//! live sampled block, its address, size, weight, allocation time and the
//! stack that allocated it, in this process's memory, for allocprof to read
//! from outside when it attaches late or meets a fork child.
//!
//! * The header is [`HEADER`] in `.data`, named by a `.note.allocprof` note
//!   of type 2 (emitted by [`setup`]'s assembly). [`setup`] fills it when
//!   the sample region is created; `USED[k]` is raised by the region when
//!   it hands out a never-used slot of class `k` ([`note_used`]).
//! * The record table (one record per slot, indexed like the region's side
//!   table) is mapped by `sample_region::mapping` with the region. Without
//!   it (`ALLOCPROF_LEDGER=0`, or the mapping failed) the header's `TABLE`
//!   stays 0 and nothing here costs more than one load per sample.
//!
//! Writer protocol (a record is only written by the thread that owns its
//! slot; another process reads it concurrently): on a placed sample, after
//! the alloc probe fired (so that a reader that sees the record and then
//! looks at the kernel's live set finds the block there if it was attached
//! in time), `SEQ` goes odd, the fields are written, `SEQ` goes even. On a
//! free, before the free probe fires, `SEQ` odd, `FLAGS = 0`, `SEQ` even.
//!
//! Stacks are taken on the sampling slow path, innermost first, allocator
//! frames included ([`capture`]): by following frame pointers inside this
//! thread's stack mapping when the chain ends cleanly, else by the
//! ledger's own CFI unwinder (`cfi`, [`FLAG_UNWOUND`]; never libgcc's,
//! which takes locks). See `stack` for why neither can crash, recurse or
//! deadlock the process.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use profiler_common::ledger::{
    FLAG_LIVE, FRAMES, HEADER_WORDS, MAGIC, MAX_RANGES, RECORD_BYTES, RECORD_WORDS, VERSION,
    header, record,
};

use self::stack::take_stack;
use crate::thread_state;

mod cfi;
mod stack;

#[repr(C, align(64))]
struct Header([AtomicU64; HEADER_WORDS]);

const fn header_init() -> [AtomicU64; HEADER_WORDS] {
    let mut h = [const { AtomicU64::new(0) }; HEADER_WORDS];
    h[header::MAGIC] = AtomicU64::new(MAGIC);
    h[header::VERSION] = AtomicU64::new(VERSION);
    h[header::RECORD_BYTES] = AtomicU64::new(RECORD_BYTES as u64);
    h[header::FRAMES] = AtomicU64::new(FRAMES as u64);
    h
}

/// Non-zero from the start (the magic), so it lies in `.data`: a part of
/// the library file, which the note's address can name.
static HEADER: Header = Header(header_init());

/// Address of record 0 for the writers (0 = no ledger). The header's
/// `TABLE` says the same to readers.
static TABLE: AtomicUsize = AtomicUsize::new(0);

/// One record's words.
type Record = [AtomicU64; RECORD_WORDS];

// --- The switch -----------------------------------------------------------

const UNREAD: u64 = 0;
const ON: u64 = 1;
const OFF: u64 = 2;
static SWITCH: AtomicU64 = AtomicU64::new(UNREAD);

/// `ALLOCPROF_LEDGER`: `0`/`off`/`no`/`false` turn the ledger off; unset,
/// empty, `1`/`on`/`yes`/`true` leave it on; anything else is warned about
/// once and leaves it on. Read once, without allocating ([`crate::env`]).
pub fn enabled() -> bool {
    match SWITCH.load(Ordering::Relaxed) {
        ON => return true,
        OFF => return false,
        _ => {}
    }
    let (on, bad) = crate::env::with_var(c"ALLOCPROF_LEDGER", |v| {
        v.map_or((true, false), parse_switch)
    });
    let v = if on { ON } else { OFF };
    // Only the thread that publishes first warns.
    if SWITCH
        .compare_exchange(UNREAD, v, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
        && bad
    {
        const MSG: &[u8] = b"allocprof: malformed ALLOCPROF_LEDGER (expected 0/off or 1/on); the ledger stays on\n";
        // SAFETY: write(2) of a static buffer; nowhere to report a failure.
        unsafe { libc::syscall(libc::SYS_write, 2, MSG.as_ptr(), MSG.len()) };
    }
    SWITCH.load(Ordering::Relaxed) == ON
}

/// (on, malformed) for a value of `ALLOCPROF_LEDGER`.
pub fn parse_switch(v: &[u8]) -> (bool, bool) {
    let t = v.trim_ascii();
    let is = |w: &[u8]| t.eq_ignore_ascii_case(w);
    if is(b"0") || is(b"off") || is(b"no") || is(b"false") {
        (false, false)
    } else if t.is_empty() || is(b"1") || is(b"on") || is(b"yes") || is(b"true") {
        (true, false)
    } else {
        (true, true)
    }
}

// --- Header ----------------------------------------------------------------

/// Fill the header once the sample region exists: `table` (0 = no ledger)
/// holds `capacity` records; range `k` of `first.len()` starts at record
/// `first[k]`. Called once, before the region is published.
#[cold]
#[inline(never)]
pub(crate) fn setup(table: usize, capacity: usize, base: usize, len: usize, first: &[usize]) {
    // The note naming the header (see profiler_common::ledger): non-alloc,
    // like `.note.stapsdt`, so it costs no memory at run time. Here because
    // every library that has a sample region calls this.
    // SAFETY: assembler directives only: they add a note to another
    // section and emit no instruction.
    unsafe {
        core::arch::asm!(
            ".pushsection .note.allocprof,\"\",\"note\"",
            ".balign 4",
            ".4byte 992f-991f, 994f-993f, 2",
            "991: .asciz \"allocprof\"",
            "992: .balign 4",
            "993: .8byte {header}",
            "994: .balign 4",
            ".popsection",
            header = sym HEADER,
            options(nomem, nostack, preserves_flags),
        );
    }
    let h = &HEADER.0;
    if table == 0 {
        // No ledger, but samples from now on: a reader must know that live
        // samples exist that no record holds (`HeaderError::Off`).
        h[header::REGION_BASE].store(base as u64, Ordering::Relaxed);
        h[header::REGION_LEN].store(len as u64, Ordering::Release);
        return;
    }
    let ranges = first.len().min(MAX_RANGES);
    h[header::CAPACITY].store(capacity as u64, Ordering::Relaxed);
    h[header::REGION_BASE].store(base as u64, Ordering::Relaxed);
    h[header::REGION_LEN].store(len as u64, Ordering::Relaxed);
    h[header::RANGES].store(ranges as u64, Ordering::Relaxed);
    for (k, &f) in first.iter().take(ranges).enumerate() {
        h[header::FIRST + k].store(f as u64, Ordering::Relaxed);
    }
    TABLE.store(table, Ordering::Relaxed);
    // Last: a reader that sees the table sees the rest.
    h[header::TABLE].store(table as u64, Ordering::Release);
}

/// Slot `idx` of class `k` is handed out for the first time: records
/// `0..=idx` of range `k` may be used. Rare (once per slot ever used).
pub(crate) fn note_used(k: usize, idx: usize) {
    if k < MAX_RANGES {
        HEADER.0[header::USED + k].fetch_max(idx as u64 + 1, Ordering::Relaxed);
    }
}

/// Bytes of the record table for `slots` slots.
pub(crate) const fn table_bytes(slots: usize) -> usize {
    slots * RECORD_BYTES
}

fn record_at(id: usize) -> Option<&'static Record> {
    let table = TABLE.load(Ordering::Relaxed);
    if table == 0 || id as u64 >= HEADER.0[header::CAPACITY].load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: the table holds CAPACITY records, is mapped read-write for
    // the life of the process and is only ever accessed through atomics.
    Some(unsafe { &*((table + id * RECORD_BYTES) as *const Record) })
}

// --- Writers ---------------------------------------------------------------

/// What [`capture`] took before the alloc probe fired.
pub(crate) struct Captured {
    time_ns: u64,
    flags: u64,
    n: usize,
    frames: [u64; FRAMES],
}

/// Whether the ledger exists (a sample's capture is worth taking).
#[inline]
pub(crate) fn active() -> bool {
    TABLE.load(Ordering::Relaxed) != 0
}

/// The time and stack of a sampled allocation, or `None` without a ledger.
/// No frames when this thread is already inside the allocator's slow path
/// (a signal handler's malloc in the middle of a capture).
#[inline(never)]
pub(crate) fn capture() -> Option<Captured> {
    if !active() {
        return None;
    }
    let mut c = Captured {
        time_ns: crate::clock::monotonic_ns(),
        flags: FLAG_LIVE,
        n: 0,
        frames: [0; FRAMES],
    };
    crate::errno::preserving(|| thread_state::exclusive(|cache| take_stack(&mut c, cache)));
    Some(c)
}

/// Writes the record of the block `p` (just placed, its alloc probe fired).
pub(crate) fn publish_alloc(id: Option<usize>, p: usize, size: usize, weight: u64, c: &Captured) {
    let Some(r) = id.and_then(record_at) else {
        return;
    };
    let seq = r[record::SEQ].load(Ordering::Relaxed);
    // The odd value reaches memory before any field (x86 keeps stores in
    // order; the fence keeps the compiler from reordering them).
    r[record::SEQ].store(seq | 1, Ordering::Relaxed);
    fence(Ordering::Release);
    for (i, v) in [
        (record::PTR, p as u64),
        (record::SIZE, size as u64),
        (record::WEIGHT, weight),
        (record::TIME_NS, c.time_ns.max(1)),
        (record::FLAGS, c.flags),
        (record::NFRAMES, c.n as u64),
    ] {
        r[i].store(v, Ordering::Relaxed);
    }
    for (i, &f) in c.frames[..c.n].iter().enumerate() {
        r[record::FRAMES + i].store(f, Ordering::Relaxed);
    }
    r[record::SEQ].store((seq | 1) + 1, Ordering::Release);
}

/// Clears the record of the block being freed (before its free probe).
pub(crate) fn publish_free(id: Option<usize>) {
    let Some(r) = id.and_then(record_at) else {
        return;
    };
    let seq = r[record::SEQ].load(Ordering::Relaxed);
    r[record::SEQ].store(seq | 1, Ordering::Relaxed);
    fence(Ordering::Release);
    r[record::FLAGS].store(0, Ordering::Relaxed);
    r[record::SEQ].store((seq | 1) + 1, Ordering::Release);
}

/// Copies of the header and of record `id`, for the tests.
#[cfg(test)]
pub(crate) fn snapshot_header() -> [u64; HEADER_WORDS] {
    core::array::from_fn(|i| HEADER.0[i].load(Ordering::Acquire))
}

#[cfg(test)]
pub(crate) fn snapshot_record(id: usize) -> Option<[u64; RECORD_WORDS]> {
    let r = record_at(id)?;
    Some(core::array::from_fn(|i| r[i].load(Ordering::Acquire)))
}

#[cfg(test)]
pub(crate) fn stack_mapping_for_test(addr: usize) -> Option<(usize, usize)> {
    stack::mapping_of(addr)
}

#[cfg(test)]
pub(crate) fn walk_for_test(
    fp: usize,
    sp: usize,
    hi: usize,
    out: &mut [u64; FRAMES],
) -> Option<(usize, bool)> {
    match stack::walk_frame_pointers(fp, sp, hi, out) {
        stack::Walk::Whole(n, truncated) => Some((n, truncated)),
        stack::Walk::Broken(_) => None,
    }
}

#[cfg(test)]
mod tests;
