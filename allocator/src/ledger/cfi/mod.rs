//! The ledger's own CFI unwinder: allocation-free, lock-free, bounded.
//!
//! libgcc's `_Unwind_Backtrace` cannot be called from inside `malloc`:
//! libgcc 12 holds its `object_mutex` while it sorts the FDEs of frames
//! registered with `__register_frame` (JIT code) with `malloc`, and a sampled
//! allocation there would take the same mutex again on the same thread. So
//! the ledger unwinds by itself:
//!
//! * the object of a pc comes from glibc's `_dl_find_object` (>= 2.35,
//!   lock-free and async-signal-safe; referenced weakly: without it no
//!   stack is unwound, see [`available`]); a pc it does not know (JIT code,
//!   or an object unloaded meanwhile) ends the walk as cut short;
//! * its `.eh_frame_hdr` table is binary-searched, the FDE and its CIE are
//!   decoded and their CFA program is run up to the pc, for the CFA (from
//!   rsp or rbp plus an offset), the return address and the saved rbp; an
//!   instruction it does not model for those (DWARF expressions, as in
//!   glibc's signal trampoline), an unknown encoding, more than
//!   [`MAX_OPS`] instructions or any check failing ends the walk as cut short;
//! * every read of CFI data lies inside the readable `PT_LOAD` segment that
//!   holds the object's `.eh_frame_hdr` (found from the ELF header at
//!   `dlfo_map_start`, which the first segment maps from file offset 0),
//!   and every read of the stack lies inside the thread's stack mapping;
//!   each frame's CFA is strictly above the previous one and at most
//!   `FRAMES` frames are taken, so the walk ends.

use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering};

use profiler_common::ledger::{FRAMES, MAX_ADDRESS};

mod cache;
mod fde;
mod read;

pub(crate) use self::fde::{Row, Rule};
#[cfg(test)]
use self::fde::{find_fde, row_for};
pub(crate) use self::read::Mem;

/// glibc's `struct dl_find_object` (<dlfcn.h>, glibc 2.35).
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: usize,
    map_end: usize,
    link_map: *mut c_void,
    eh_frame: usize,
    reserved: [u64; 7],
}

impl Default for DlFindObject {
    fn default() -> Self {
        DlFindObject {
            flags: 0,
            map_start: 0,
            map_end: 0,
            link_map: core::ptr::null_mut(),
            eh_frame: 0,
            reserved: [0; 7],
        }
    }
}

type DlFindObjectFn = unsafe extern "C" fn(*const c_void, *mut DlFindObject) -> i32;

/// `_dl_find_object`'s address (0: not there, or not yet looked up).
static DL_FIND_OBJECT: AtomicUsize = AtomicUsize::new(0);

/// Looks `_dl_find_object` up once, when the library is loaded (a
/// constructor: the slow path must never call `dlsym`, which takes the
/// loader's lock). By name rather than by a link-time reference, which
/// would bind version GLIBC_2.35 and keep the library from loading on
/// glibc 2.34 (RHEL 9's): there it is absent and stacks are cut instead.
/// A sample taken before this runs (another object's constructor) is cut.
extern "C" fn look_up_dl_find_object() {
    // SAFETY: dlsym with a NUL-terminated name; at load time the loader's
    // lock is ours already (recursive) and allocating is allowed.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
    DL_FIND_OBJECT.store(p as usize, Ordering::Release);
}

#[used]
#[unsafe(link_section = ".init_array")]
static LOOK_UP_DL_FIND_OBJECT: extern "C" fn() = look_up_dl_find_object;

/// `_dl_find_object`, if this glibc has it.
fn dl_find_object() -> Option<DlFindObjectFn> {
    let p = DL_FIND_OBJECT.load(Ordering::Acquire);
    // SAFETY: a non-null result of dlsym for this name is glibc's
    // function, of this signature.
    (p != 0).then(|| unsafe { core::mem::transmute::<usize, DlFindObjectFn>(p) })
}

/// Whether stacks can be unwound here (glibc >= 2.35).
pub(super) fn available() -> bool {
    dl_find_object().is_some()
}

/// The object holding `pc`: `(dlfo_map_start, dlfo_map_end)`.
pub(super) fn object_of(pc: usize) -> Option<(usize, usize)> {
    let find = dl_find_object()?;
    let mut r = DlFindObject::default();
    // SAFETY: glibc fills `r` (ours, of the struct's size); the call takes
    // no lock and does not allocate.
    let found = unsafe { find(pc as *const c_void, &mut r) } == 0;
    (found && r.map_start < r.map_end).then_some((r.map_start, r.map_end))
}

/// CFA instructions run per frame (CIE and FDE together) at most.
pub(crate) const MAX_OPS: usize = 256;
/// `DW_CFA_remember_state` nesting at most.
const MAX_STATES: usize = 4;

const RBP: u64 = 6;
const RSP: u64 = 7;

/// The readable segment holding `hdr` in the object mapped at
/// `[map_start, map_end)`, from its program headers: the ELF header and
/// the program headers lie in the first page at `map_start` (the first
/// `PT_LOAD` maps file offset 0 there; checked).
fn eh_segment(map_start: usize, map_end: usize, hdr: usize) -> Option<Mem> {
    const PT_LOAD: u32 = 1;
    const PF_R: u32 = 4;
    let map = Mem {
        lo: map_start,
        hi: map_end,
    };
    let ehdr: [u8; 64] = map.read(map_start)?;
    if ehdr[..4] != *b"\x7fELF" || ehdr[4] != 2 {
        return None;
    }
    let phoff = u64::from_le_bytes(ehdr[32..40].try_into().ok()?) as usize;
    let phentsize = u16::from_le_bytes([ehdr[54], ehdr[55]]) as usize;
    let phnum = u16::from_le_bytes([ehdr[56], ehdr[57]]) as usize;
    // The program headers must lie in the first page, which the first
    // segment maps (a gap between segments may be PROT_NONE).
    if phentsize != 56 || phoff.checked_add(phnum * 56).is_none_or(|e| e > 4096) {
        return None;
    }
    let mut loads = [(0usize, 0usize, 0usize, 0u32); 16];
    let mut n = 0;
    for i in 0..phnum {
        let ph: [u8; 56] = map.read(map_start.checked_add(phoff)?.checked_add(i * 56)?)?;
        let word = |at: usize| u64::from_le_bytes(ph[at..at + 8].try_into().unwrap()) as usize;
        let kind = u32::from_le_bytes(ph[0..4].try_into().ok()?);
        if kind == PT_LOAD && n < loads.len() {
            let flags = u32::from_le_bytes(ph[4..8].try_into().ok()?);
            // (offset, vaddr, filesz, flags)
            loads[n] = (word(8), word(16), word(32), flags);
            n += 1;
        }
    }
    let loads = &loads[..n];
    // The load bias: map_start is where the first segment (by address)
    // begins, and it must be the one that maps the ELF header.
    let first = loads.iter().min_by_key(|l| l.1)?;
    if first.0 != 0 {
        return None;
    }
    let bias = map_start.wrapping_sub(first.1);
    loads
        .iter()
        .filter(|l| l.3 & PF_R != 0)
        .map(|l| {
            let lo = bias.wrapping_add(l.1);
            (lo, lo.wrapping_add(l.2))
        })
        .find(|&(lo, hi)| lo <= hdr && hdr < hi)
        .map(|(lo, hi)| Mem {
            lo: lo.max(map_start),
            hi: hi.min(map_end),
        })
}

/// One object's CFI, kept across the frames of a walk.
#[derive(Clone, Copy)]
struct Object {
    map_start: usize,
    map_end: usize,
    hdr: usize,
    mem: Mem,
}

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// At the bottom of the stack: a return address the CFI calls undefined
    /// (`_start`, a thread's start) or null.
    Bottom,
    /// After `FRAMES` frames, with more to come.
    Full,
    /// Code the unwinder could not step through (no object or no FDE for
    /// the pc, as JIT code; CFI it does not model; a check failing).
    Cut,
}

/// Walks the stack from a frame whose return address is `ra`, whose
/// caller's stack pointer is `sp` and whose caller's rbp is `rbp`, reading
/// the stack only inside `stack`. Writes the return addresses, `ra` first;
/// returns how many and why it ended.
pub(crate) fn walk(
    ra: usize,
    sp: usize,
    rbp: usize,
    stack: Mem,
    out: &mut [u64; FRAMES],
) -> (usize, End) {
    let Some(find) = dl_find_object() else {
        return (0, End::Cut);
    };
    let (mut pc, mut sp, mut rbp) = (ra, sp, Some(rbp));
    let mut obj: Option<Object> = None;
    let mut n = 0;
    loop {
        if pc == 0 {
            return (n, End::Bottom);
        }
        if pc as u64 >= MAX_ADDRESS {
            return (n, End::Cut);
        }
        if n == FRAMES {
            return (n, End::Full);
        }
        out[n] = pc as u64;
        n += 1;
        // The call instruction, which a return address follows.
        let at = pc - 1;
        if !obj.is_some_and(|o| o.map_start <= at && at < o.map_end) {
            let mut r = DlFindObject::default();
            // SAFETY: glibc fills `r` (ours, the struct's size); the call
            // takes no lock and does not allocate.
            if unsafe { find(at as *const c_void, &mut r) } != 0 || r.eh_frame == 0 {
                return (n, End::Cut);
            }
            let Some(mem) = eh_segment(r.map_start, r.map_end, r.eh_frame) else {
                return (n, End::Cut);
            };
            obj = Some(Object {
                map_start: r.map_start,
                map_end: r.map_end,
                hdr: r.eh_frame,
                mem,
            });
        }
        let o = obj.expect("set above");
        let Some(row) = cache::row_at(o.mem, o.hdr, at) else {
            return (n, End::Cut);
        };
        match step(&row, sp, rbp, stack) {
            Some(Some((next_pc, next_sp, next_rbp))) => {
                (pc, sp, rbp) = (next_pc, next_sp, next_rbp)
            }
            Some(None) => return (n, End::Bottom),
            None => return (n, End::Cut),
        }
    }
}

/// The caller's (pc, sp, rbp) by `row`: `Some(None)` at the bottom of the
/// stack, `None` where the row cannot be followed.
pub(crate) fn step(
    row: &Row,
    sp: usize,
    rbp: Option<usize>,
    stack: Mem,
) -> Option<Option<(usize, usize, Option<usize>)>> {
    if row.cfa_unknown {
        return None;
    }
    let base = match row.cfa_reg {
        RSP => sp,
        RBP => rbp?,
        _ => return None,
    };
    let cfa = base.checked_add_signed(isize::try_from(row.cfa_off).ok()?)?;
    // Strictly up the stack, inside it: the walk ends.
    if cfa <= sp || cfa > stack.hi {
        return None;
    }
    let load = |rule_off: i64| -> Option<usize> {
        let at = cfa.checked_add_signed(isize::try_from(rule_off).ok()?)?;
        if !at.is_multiple_of(8) {
            return None;
        }
        stack.read::<8>(at).map(usize::from_le_bytes)
    };
    let ra = match row.ra {
        Rule::Undefined => return Some(None),
        Rule::At(off) => load(off)?,
        Rule::Same | Rule::Unknown => return None,
    };
    let rbp = match row.rbp {
        Rule::Same => rbp,
        Rule::At(off) => Some(load(off)?),
        Rule::Undefined | Rule::Unknown => None,
    };
    Some(Some((ra, cfa, rbp)))
}

#[cfg(test)]
mod tests;
