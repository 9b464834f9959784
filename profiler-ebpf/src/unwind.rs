//! The user stack walked with compiled call-frame information (see
//! `profiler_common::unwind`), for processes user space has given tables:
//! code built without frame pointers unwinds whole. A pc outside every
//! table falls back to one frame-pointer step (never two in a row); a pc
//! whose rule cannot be applied ends the walk with `TRUNCATED_FRAME`, never
//! with garbage. A process without tables (yet) is walked by frame
//! pointers, its stack ending in `NO_TABLES_FRAME` for user space to check.
//! A stack deeper than `MAX_STACK_DEPTH` ends in a depth marker.

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_probe_read_user, generated, generated::bpf_loop},
    programs::ProbeContext,
};
use profiler_common::{
    DropReason, MAX_STACK_DEPTH,
    unwind::{
        CACHED_FRAME_POINTERS, CACHED_ROW, DEPTH_CUT_FRAME, FRAME_POINTERS, MAX_UNWIND_MAPPINGS,
        NO_TABLES_DEPTH_FRAME, NO_TABLES_FRAME, ProcUnwind, TRUNCATED_FRAME, UnwindCacheEntry,
        UnwindMapping, UnwindRow, cfa, rbp, unwind_cache_slot,
    },
};

use crate::maps::{
    BLOCK, BLOCK_WORDS, STACK_BLOCK, STACK_SCRATCH, UNWIND_CACHE, UNWIND_PROCS, UNWIND_ROWS,
    unwind_tables_on,
};

/// Binary search steps over a process's mappings (2^9 > MAX_UNWIND_MAPPINGS).
const MAPPING_STEPS: usize = 9;
/// Binary search steps over one file's rows (tables hold < 2^24 rows).
const ROW_STEPS: usize = 24;
/// How far above the stack pointer a frame pointer may point to be trusted.
const MAX_FRAME_SPAN: u64 = 8 << 20;
/// `Walk::block` when no block is held: never a block's address (blocks are
/// aligned).
const NO_BLOCK: u64 = 1;

/// Walks the current user stack into `STACK_SCRATCH` with the tables of
/// `pid`. `None` when the process has no tables (the caller walks frame
/// pointers). One frame per `bpf_loop` iteration: the verifier checks the
/// step once, not once per frame.
#[inline(always)]
pub fn walk(ctx: &ProbeContext, pid: u32) -> Option<usize> {
    let proc = UNWIND_PROCS.get_ptr(pid)?;
    // SAFETY: the context of a uprobe is its pt_regs; constant-offset reads.
    let regs = unsafe { &*ctx.regs };
    // SAFETY: a map value, valid for the whole program run.
    let version = unsafe { (*proc).version };
    let mut walk = Walk {
        proc,
        version,
        pid,
        fell_back: 0,
        pc: regs.rip,
        sp: regs.rsp,
        bp: regs.rbp,
        len: 0,
        block: NO_BLOCK,
        limit: MAX_STACK_DEPTH as u64,
    };
    // SAFETY: the callback is a BPF subprogram taking (index, &mut Walk);
    // `walk` outlives the call.
    unsafe {
        bpf_loop(
            MAX_STACK_DEPTH as u32,
            unwind_step as *mut c_void,
            (&raw mut walk).cast(),
            0,
        )
    };
    Some(walk.len as usize)
}

/// Walks the current user stack by frame pointers into `STACK_SCRATCH`,
/// for a process without tables; returns its length. With unwind tables on
/// (the process's are not in yet: a new or just exec'ed process), the
/// stack ends in `NO_TABLES_FRAME` (`NO_TABLES_DEPTH_FRAME` if cut at the
/// depth limit): in code built without frame pointers rbp is a general
/// register, and user space keeps only the frames it can vouch for. Each
/// step must find its frame above the last one on the stack (see
/// `frame_pointer_step`), so a garbage rbp mostly ends the walk at once
/// instead of making up frames (and stacks, which each cost a stack-table
/// entry).
#[inline(always)]
pub fn walk_without_tables(ctx: &ProbeContext) -> Option<usize> {
    // A load-time constant: the verifier explores one of the two.
    let mark = unwind_tables_on();
    // Room for the marker.
    let limit = if mark {
        MAX_STACK_DEPTH - 1
    } else {
        MAX_STACK_DEPTH
    };
    // SAFETY: the context of a uprobe is its pt_regs; constant-offset reads.
    let regs = unsafe { &*ctx.regs };
    let mut walk = Walk {
        proc: core::ptr::null(),
        version: 0,
        pid: 0,
        fell_back: 0,
        pc: regs.rip,
        sp: regs.rsp,
        bp: regs.rbp,
        len: 0,
        block: NO_BLOCK,
        limit: limit as u64,
    };
    // SAFETY: as in `walk`.
    unsafe {
        bpf_loop(
            limit as u32,
            frame_pointer_walk_step as *mut c_void,
            (&raw mut walk).cast(),
            0,
        )
    };
    let cut = walk.fell_back != 0;
    let trace = STACK_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a per-CPU map value, ours under the scratch claim.
    let trace = unsafe { &mut *trace };
    let len = walk.len as usize;
    let (at, marker) = match (mark, cut) {
        (true, false) => (len, NO_TABLES_FRAME),
        (true, true) => (len, NO_TABLES_DEPTH_FRAME),
        // Deeper than the stack table holds: the last frame gives way.
        (false, true) => (len.wrapping_sub(1), DEPTH_CUT_FRAME),
        (false, false) => return Some(len.min(MAX_STACK_DEPTH)),
    };
    // Reloaded, so the bound is checked on the register the store indexes
    // by (see `unwind_step`).
    // SAFETY: a read of a local.
    let slot = unsafe { core::ptr::read_volatile(&at) };
    match trace.frames.get_mut(slot) {
        Some(frame) => {
            *frame = marker;
            Some(slot + 1)
        }
        None => Some(len.min(MAX_STACK_DEPTH)),
    }
}

/// The state of a walk, carried between `bpf_loop` iterations.
#[repr(C)]
struct Walk {
    /// The process's tables, looked up once: the verifier follows a map
    /// value pointer spilled to the caller's stack into the callback, and
    /// a hash lookup per frame cost ~25 ns.
    proc: *const ProcUnwind,
    /// The table's `version`: the key of `UNWIND_CACHE`.
    version: u64,
    pid: u32,
    /// The last step was a frame-pointer step (code without a rule).
    fell_back: u32,
    pc: u64,
    sp: u64,
    bp: u64,
    len: u64,
    /// The address of the user stack block held in `STACK_BLOCK`, or
    /// `NO_BLOCK` (see `read_user`).
    block: u64,
    /// Frames a walk without tables takes at most (its `bpf_loop` count).
    limit: u64,
}

const CONTINUE: i64 = 0;
const STOP: i64 = 1;

/// One frame: records `pc`, then finds its caller.
#[inline(never)]
extern "C" fn unwind_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `walk` passed its own `Walk` as the loop's context.
    let walk = unsafe { &mut *ctx.cast::<Walk>() };
    let Some(trace) = STACK_SCRATCH.get_ptr_mut(0) else {
        return STOP;
    };
    // SAFETY: a per-CPU map value, claimed by the caller for this walk.
    let trace = unsafe { &mut *trace };
    // SAFETY: a map value, valid for the whole program run; only read.
    let proc = unsafe { &*walk.proc };
    let i = index as usize;
    if i >= MAX_STACK_DEPTH {
        return STOP;
    }
    let pc = walk.pc;
    trace.frames[i] = pc;
    walk.len = index + 1;
    // A return address points after its call: look up the call itself.
    let at = if i == 0 { pc } else { pc.wrapping_sub(1) };
    let (found, row) = resolve(proc, walk.version, at);
    // A return address in a file that keeps frame pointers throughout:
    // its caller is one frame-pointer step away, no table lookup needed
    // (not the first frame, which may be anywhere in its function). A
    // zero rbp marks the outermost frame (`_start` clears it). The paths
    // stay apart: the verifier checks them one after the other, not one
    // inside the other.
    let step = if i > 0 && found & CACHED_FRAME_POINTERS != 0 {
        walk.fell_back = 0;
        if walk.bp == 0 {
            Step::End
        } else {
            frame_pointer_step(walk)
        }
    } else if found & CACHED_ROW != 0 {
        walk.fell_back = 0;
        apply(&row, walk)
    } else if walk.fell_back == 0 {
        // Code without a table (JIT code, a file without CFI or whose
        // table did not fit): one frame-pointer step, never two in a row
        // (rbp is a general register in code built without frame pointers).
        walk.fell_back = 1;
        frame_pointer_step(walk)
    } else {
        Step::Truncated
    };
    match step {
        // Deeper than the stack table holds: the last frame gives way to
        // the depth marker.
        Step::Caller { pc, .. } if pc != 0 && i + 1 >= MAX_STACK_DEPTH => {
            trace.frames[i] = DEPTH_CUT_FRAME;
            STOP
        }
        Step::Caller { pc, sp, bp } if pc != 0 => {
            (walk.pc, walk.sp, walk.bp) = (pc, sp, bp);
            CONTINUE
        }
        Step::Caller { .. } | Step::End => STOP,
        Step::Truncated => {
            let next = i + 1;
            // Reloaded, so the bound is checked on the register the store
            // indexes by (the compiler would otherwise test a copy, which
            // the verifier does not connect to it).
            // SAFETY: a read of a local.
            let slot = unsafe { core::ptr::read_volatile(&next) };
            if let Some(frame) = trace.frames.get_mut(slot) {
                *frame = TRUNCATED_FRAME;
                walk.len = slot as u64 + 1;
            }
            // Here, in the loop's callback, the verifier checks it once.
            let count = crate::probes::count_drop(walk.pid, DropReason::StackTruncated);
            // The rare path's diagnostic (`allocprof --verbose`; compiled
            // out by the verifier otherwise: the level is a constant): the
            // 1st, 2nd, 4th, 8th... of a process, so a process whose every
            // walk is cut short costs a log line now and then, not each time.
            // Integers only: each argument costs the verifier a serialization.
            if count & count.wrapping_sub(1) == 0 {
                aya_log_ebpf::warn!(
                    &(),
                    "pid {}: stack walk cut short at pc 0x{:x} (no unwind table covers it: {}; \
                     walks of the process cut short so far: {})",
                    walk.pid,
                    pc,
                    walk.fell_back,
                    count
                );
            }
            STOP
        }
    }
}

/// One frame of a walk without tables: records `pc`, then steps by frame
/// pointer; `fell_back` says the walk reached `limit` with callers left.
#[inline(never)]
extern "C" fn frame_pointer_walk_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `walk_without_tables` passed its own `Walk` as the context.
    let walk = unsafe { &mut *ctx.cast::<Walk>() };
    let Some(trace) = STACK_SCRATCH.get_ptr_mut(0) else {
        return STOP;
    };
    // SAFETY: a per-CPU map value, claimed by the caller for this walk.
    let trace = unsafe { &mut *trace };
    let i = index as usize;
    if i >= MAX_STACK_DEPTH {
        return STOP;
    }
    trace.frames[i] = walk.pc;
    walk.len = index + 1;
    // A zero rbp marks the outermost frame (`_start` clears it).
    if walk.bp == 0 {
        return STOP;
    }
    match frame_pointer_step(walk) {
        Step::Caller { pc, .. } if pc != 0 && index + 1 >= walk.limit => {
            walk.fell_back = 1;
            STOP
        }
        Step::Caller { pc, sp, bp } if pc != 0 => {
            (walk.pc, walk.sp, walk.bp) = (pc, sp, bp);
            CONTINUE
        }
        _ => STOP,
    }
}

enum Step {
    Caller {
        pc: u64,
        sp: u64,
        bp: u64,
    },
    /// The outermost frame: the stack is complete.
    End,
    /// No rule could be applied.
    Truncated,
}

#[inline(always)]
fn apply(row: &UnwindRow, walk: &mut Walk) -> Step {
    let base = match row.cfa_rule {
        cfa::RSP => walk.sp,
        cfa::RBP => walk.bp,
        cfa::PLT => walk.sp.wrapping_add(if walk.pc & 15 >= 11 { 8 } else { 0 }),
        cfa::END => return Step::End,
        _ => return Step::Truncated,
    };
    let cfa = base.wrapping_add(i64::from(row.cfa_offset) as u64);
    let Some(ra) = read_user(walk, cfa.wrapping_sub(8)) else {
        return Step::Truncated;
    };
    let bp = if row.rbp_rule == rbp::AT_CFA {
        match read_user(walk, cfa.wrapping_add(i64::from(row.rbp_offset) as u64)) {
            Some(v) => v,
            None => return Step::Truncated,
        }
    } else {
        walk.bp
    };
    Step::Caller {
        pc: ra,
        sp: cfa,
        bp,
    }
}

/// One step by frame pointer, if rbp looks like one: a frame above the
/// last (the stack grows down), within `MAX_FRAME_SPAN`, aligned. Code
/// without a table (JIT code, a file whose table did not fit) gets one;
/// a process without tables gets one per frame.
#[inline(always)]
fn frame_pointer_step(walk: &mut Walk) -> Step {
    let (sp, bp) = (walk.sp, walk.bp);
    if bp < sp || bp - sp > MAX_FRAME_SPAN || bp & 7 != 0 {
        return Step::Truncated;
    }
    let Some(ra) = read_user(walk, bp.wrapping_add(8)) else {
        return Step::Truncated;
    };
    match read_user(walk, bp) {
        Some(saved_bp) => Step::Caller {
            pc: ra,
            sp: bp.wrapping_add(16),
            bp: saved_bp,
        },
        None => Step::Truncated,
    }
}

/// What the process's table says about `at`: `CACHED_*` bits and the row
/// (meaningful with `CACHED_ROW`), from this CPU's cache if this table
/// found it before, else by binary search (then cached). Either way the
/// result is read back from the entry: to the verifier one unknown value,
/// so the step that follows is verified once, not once per way the
/// searches ended.
#[inline(always)]
fn resolve(proc: &ProcUnwind, version: u64, at: u64) -> (u32, UnwindRow) {
    let Some(e) = UNWIND_CACHE.get_ptr_mut(unwind_cache_slot(version, at)) else {
        return (0, UnwindRow::default());
    };
    // SAFETY: this CPU's entry, ours alone under the stack scratch claim
    // (see `UNWIND_CACHE`); aligned fields of a map value.
    unsafe {
        let hit = core::ptr::read_volatile(&(*e).version) == version
            && core::ptr::read_volatile(&(*e).at) == at;
        if !hit {
            core::ptr::write_volatile(e, search(proc, version, at));
        }
        (
            core::ptr::read_volatile(&(*e).found),
            core::ptr::read_volatile(&(*e).row),
        )
    }
}

/// The cache entry for `at` by binary search of the mappings and the rows.
/// The row is searched for even in a file with frame pointers, so that an
/// entry does not depend on which frame of a walk asked for it.
#[inline(always)]
fn search(proc: &ProcUnwind, version: u64, at: u64) -> UnwindCacheEntry {
    let mut entry = UnwindCacheEntry {
        version,
        at,
        ..UnwindCacheEntry::default()
    };
    if let Some(m) = find_mapping(proc, at) {
        if m.flags & FRAME_POINTERS != 0 {
            entry.found |= CACHED_FRAME_POINTERS;
        }
        if let Some(r) = find_row(m, at.wrapping_sub(m.bias)) {
            entry.found |= CACHED_ROW;
            entry.row = r;
        }
    }
    entry
}

/// The mapping whose range holds `addr` (mappings sorted by start).
#[inline(always)]
fn find_mapping(proc: &ProcUnwind, addr: u64) -> Option<&UnwindMapping> {
    let (mut lo, mut hi) = (0usize, (proc.len as usize).min(MAX_UNWIND_MAPPINGS));
    for _ in 0..MAPPING_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + (hi - lo) / 2) & (MAX_UNWIND_MAPPINGS - 1);
        let m = &proc.mappings[mid];
        if addr < m.start {
            hi = mid;
        } else if addr >= m.end {
            lo = mid + 1;
        } else {
            return Some(m);
        }
    }
    None
}

/// The last row at or below `vaddr` in the mapping's file table.
#[inline(always)]
fn find_row(m: &UnwindMapping, vaddr: u64) -> Option<UnwindRow> {
    // Invariant: rows[lo].pc <= vaddr < rows[hi].pc (rows past the end as +inf).
    let first = *UNWIND_ROWS.get(m.rows_start)?;
    if m.rows_len == 0 || vaddr < first.pc {
        return None;
    }
    let (mut lo, mut hi) = (0u32, m.rows_len);
    for _ in 0..ROW_STEPS {
        if hi - lo <= 1 {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let row = UNWIND_ROWS.get(m.rows_start.wrapping_add(mid))?;
        if row.pc <= vaddr {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    UNWIND_ROWS.get(m.rows_start.wrapping_add(lo)).copied()
}

/// A word of the user stack. Each read of user memory costs ~0.1 µs of
/// fixed overhead (the kernel's hardened-usercopy check and fault setup),
/// far more than the copy, and a walk reads one or two words per frame,
/// mostly close together: so an aligned word comes from a copy of its
/// `BLOCK`-byte block, read once per walk (aligned, so it never spans two
/// pages: it is readable exactly when the word is). Unaligned addresses,
/// which no sane frame has, are read alone.
#[inline(always)]
fn read_user(walk: &mut Walk, addr: u64) -> Option<u64> {
    if addr & 7 != 0 {
        return read_user_word(addr);
    }
    let block = addr & !(BLOCK - 1);
    let words = STACK_BLOCK.get_ptr_mut(0)?;
    if walk.block != block {
        // SAFETY: the helper writes at most BLOCK bytes into this CPU's
        // block, ours alone under the stack scratch claim (see
        // `probes::take_stack`), and reports a fault instead of taking it.
        let err = unsafe {
            generated::bpf_probe_read_user(words.cast(), BLOCK as u32, block as *const c_void)
        };
        if err != 0 {
            walk.block = NO_BLOCK;
            return None;
        }
        walk.block = block;
    }
    let i = ((addr - block) >> 3) as usize & (BLOCK_WORDS - 1);
    // SAFETY: as above; `i` is masked into the block.
    Some(unsafe { (*words)[i] })
}

#[inline(always)]
fn read_user_word(addr: u64) -> Option<u64> {
    // SAFETY: the helper copies from user memory and reports a fault instead
    // of taking it.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}
