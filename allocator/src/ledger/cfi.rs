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

/// A readable address range: every read checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mem {
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

impl Mem {
    fn has(&self, at: usize, len: usize) -> bool {
        at >= self.lo && at.checked_add(len).is_some_and(|e| e <= self.hi)
    }

    fn read<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        if !self.has(at, N) {
            return None;
        }
        // SAFETY: [at, at + N) lies in this readable range (checked).
        Some(unsafe { core::ptr::read_unaligned(at as *const [u8; N]) })
    }

    fn u32(&self, at: usize) -> Option<u32> {
        self.read(at).map(u32::from_le_bytes)
    }
}

/// A bounded reader over `[pos, end)`, `end` within `mem`.
struct Cursor {
    mem: Mem,
    pos: usize,
    end: usize,
}

impl Cursor {
    fn new(mem: Mem, pos: usize, end: usize) -> Option<Cursor> {
        (mem.has(pos, 0) && end >= pos && end <= mem.hi).then_some(Cursor { mem, pos, end })
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        if self.pos.checked_add(N)? > self.end {
            return None;
        }
        let v = self.mem.read::<N>(self.pos)?;
        self.pos += N;
        Some(v)
    }

    fn u8(&mut self) -> Option<u8> {
        self.bytes::<1>().map(|b| b[0])
    }

    fn uleb(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn sleb(&mut self) -> Option<i64> {
        let mut v = 0i64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= i64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if shift + 7 < 64 && b & 0x40 != 0 {
                    v |= -1i64 << (shift + 7);
                }
                return Some(v);
            }
        }
        None
    }

    /// A `DW_EH_PE_*` encoded value: absolute, pc-relative or relative to
    /// `datarel`; `None` for encodings the ledger never needs (indirect,
    /// text- or function-relative, aligned, omitted).
    fn encoded(&mut self, enc: u8, datarel: usize) -> Option<usize> {
        let at = self.pos;
        let v = match enc & 0x0f {
            0x00 => u64::from_le_bytes(self.bytes::<8>()?),
            0x01 => self.uleb()?,
            0x02 => u64::from(u16::from_le_bytes(self.bytes::<2>()?)),
            0x03 => u64::from(u32::from_le_bytes(self.bytes::<4>()?)),
            0x04 => u64::from_le_bytes(self.bytes::<8>()?),
            0x09 => self.sleb()? as u64,
            0x0a => i16::from_le_bytes(self.bytes::<2>()?) as u64,
            0x0b => i32::from_le_bytes(self.bytes::<4>()?) as u64,
            0x0c => u64::from_le_bytes(self.bytes::<8>()?),
            _ => return None,
        } as usize;
        match enc & 0xf0 {
            0x00 => Some(v),
            0x10 => Some(at.wrapping_add(v)),
            0x30 => Some(datarel.wrapping_add(v)),
            _ => None,
        }
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        let to = self.pos.checked_add(usize::try_from(n).ok()?)?;
        (to <= self.end).then(|| self.pos = to)
    }
}

/// How a register is recovered in the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Not saved: the caller's value is this frame's (DWARF's default for
    /// callee-saved registers).
    Same,
    /// The caller has none: for the return address, the end of the stack.
    Undefined,
    /// Saved at CFA + n.
    At(i64),
    /// Something this unwinder does not model (an expression, another
    /// register): usable neither for rbp nor for the return address.
    Unknown,
}

/// The unwind row at a pc: CFA = `cfa_reg` (rsp, rbp, or anything else:
/// unknown) + `cfa_off`, and the rules of rbp and of the return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) cfa_reg: u64,
    pub(crate) cfa_off: i64,
    /// The CFA is an expression (or a register we do not track).
    pub(crate) cfa_unknown: bool,
    pub(crate) rbp: Rule,
    pub(crate) ra: Rule,
}

/// What a CIE says that its FDEs need.
struct Cie {
    code_align: u64,
    data_align: i64,
    ra_reg: u64,
    fde_enc: u8,
    has_aug_data: bool,
    init_start: usize,
    init_end: usize,
}

fn parse_cie(mem: Mem, at: usize) -> Option<Cie> {
    let len = mem.u32(at)?;
    if len == 0 || len == u32::MAX {
        return None; // a terminator, or 64-bit DWARF (never in .eh_frame)
    }
    let end = at.checked_add(4)?.checked_add(len as usize)?;
    let mut c = Cursor::new(mem, at + 4, end)?;
    if u32::from_le_bytes(c.bytes::<4>()?) != 0 {
        return None; // not a CIE
    }
    let version = c.u8()?;
    if version != 1 && version != 3 {
        return None;
    }
    // The augmentation string (at most a few letters: "zPLR" and kin).
    let mut aug = [0u8; 8];
    let mut n = 0;
    loop {
        let b = c.u8()?;
        if b == 0 {
            break;
        }
        if n == aug.len() {
            return None;
        }
        aug[n] = b;
        n += 1;
    }
    let aug = &aug[..n];
    let code_align = c.uleb()?;
    let data_align = c.sleb()?;
    let ra_reg = if version == 1 {
        u64::from(c.u8()?)
    } else {
        c.uleb()?
    };
    let mut fde_enc = 0; // absptr
    let has_aug_data = aug.first() == Some(&b'z');
    if has_aug_data {
        let aug_len = c.uleb()?;
        let data_end = c.pos.checked_add(usize::try_from(aug_len).ok()?)?;
        for &a in &aug[1..] {
            match a {
                b'R' => fde_enc = c.u8()?,
                b'L' => {
                    c.u8()?;
                }
                b'P' => {
                    let enc = c.u8()?;
                    // Skipped, never dereferenced: only its size matters.
                    c.encoded(enc & 0x0f, 0)?;
                }
                b'S' => {}
                _ => break, // the rest is skipped by its length
            }
        }
        if data_end > end {
            return None;
        }
        c.pos = data_end;
    } else if !aug.is_empty() {
        return None; // a pre-'z' augmentation: its data has no length
    }
    Some(Cie {
        code_align,
        data_align,
        ra_reg,
        fde_enc,
        has_aug_data,
        init_start: c.pos,
        init_end: end,
    })
}

/// The row of the FDE at `fde` for `pc`; `None` if the FDE does not
/// cover `pc` or anything about it is not understood.
pub(crate) fn row_for(mem: Mem, fde: usize, pc: usize) -> Option<Row> {
    let len = mem.u32(fde)?;
    if len == 0 || len == u32::MAX {
        return None;
    }
    let end = fde.checked_add(4)?.checked_add(len as usize)?;
    let mut c = Cursor::new(mem, fde + 4, end)?;
    let cie_field = c.pos;
    let cie_off = u32::from_le_bytes(c.bytes::<4>()?);
    if cie_off == 0 {
        return None; // a CIE, not an FDE
    }
    let cie = parse_cie(mem, cie_field.checked_sub(cie_off as usize)?)?;
    let begin = c.encoded(cie.fde_enc, 0)?;
    let range = c.encoded(cie.fde_enc & 0x0f, 0)?;
    if !(begin <= pc && pc - begin < range) {
        return None;
    }
    if cie.has_aug_data {
        let n = c.uleb()?;
        c.skip(n)?;
    }
    let mut cfa = CfaProgram {
        cie: &cie,
        row: Row {
            cfa_reg: RSP,
            cfa_off: 8,
            cfa_unknown: false,
            rbp: Rule::Same,
            ra: Rule::Same,
        },
        initial: None,
        loc: begin,
        pc,
        ops: 0,
        saved: [None; MAX_STATES],
        depth: 0,
    };
    let mut init = Cursor::new(mem, cie.init_start, cie.init_end)?;
    if cfa.run(&mut init)? {
        return None; // a CIE cannot advance the location
    }
    cfa.initial = Some(cfa.row);
    cfa.run(&mut c)?;
    Some(cfa.row)
}

struct CfaProgram<'a> {
    cie: &'a Cie,
    row: Row,
    /// The row after the CIE's initial instructions (`DW_CFA_restore`).
    initial: Option<Row>,
    loc: usize,
    pc: usize,
    ops: usize,
    saved: [Option<Row>; MAX_STATES],
    depth: usize,
}

impl CfaProgram<'_> {
    /// Runs instructions until the end or until the location passes the
    /// pc: `Some(true)` if it stopped there, `None` on anything not
    /// understood.
    fn run(&mut self, c: &mut Cursor) -> Option<bool> {
        while c.pos < c.end {
            self.ops += 1;
            if self.ops > MAX_OPS {
                return None;
            }
            let op = c.u8()?;
            let delta = match op >> 6 {
                1 => Some(u64::from(op & 0x3f)),
                2 => {
                    let off = c.uleb()?;
                    self.set(u64::from(op & 0x3f), self.at(off as i64));
                    None
                }
                3 => {
                    self.restore(u64::from(op & 0x3f))?;
                    None
                }
                _ => self.extended(op, c)?,
            };
            if let Some(d) = delta {
                let next = self
                    .loc
                    .checked_add(usize::try_from(d.checked_mul(self.cie.code_align)?).ok()?)?;
                if next > self.pc {
                    return Some(true);
                }
                self.loc = next;
            }
        }
        Some(false)
    }

    /// Saved at CFA + `factored` × data alignment.
    fn at(&self, factored: i64) -> Rule {
        factored
            .checked_mul(self.cie.data_align)
            .map_or(Rule::Unknown, Rule::At)
    }

    fn set(&mut self, reg: u64, rule: Rule) {
        if reg == RBP {
            self.row.rbp = rule;
        } else if reg == self.cie.ra_reg {
            self.row.ra = rule;
        }
    }

    fn restore(&mut self, reg: u64) -> Option<()> {
        let init = self.initial?;
        if reg == RBP {
            self.row.rbp = init.rbp;
        } else if reg == self.cie.ra_reg {
            self.row.ra = init.ra;
        }
        Some(())
    }

    fn def_cfa(&mut self, reg: u64, off: i64) {
        self.row.cfa_reg = reg;
        self.row.cfa_off = off;
        self.row.cfa_unknown = false;
    }

    /// The opcodes with a 0 high part: `Some(Some(delta))` for the
    /// location advances, `Some(None)` for the others.
    fn extended(&mut self, op: u8, c: &mut Cursor) -> Option<Option<u64>> {
        match op {
            0x00 => {}                                                            // nop
            0x02 => return Some(Some(u64::from(c.u8()?))),                        // advance_loc1
            0x03 => return Some(Some(u64::from(u16::from_le_bytes(c.bytes()?)))), // advance_loc2
            0x04 => return Some(Some(u64::from(u32::from_le_bytes(c.bytes()?)))), // advance_loc4
            0x05 => {
                // offset_extended
                let (reg, off) = (c.uleb()?, c.uleb()?);
                self.set(reg, self.at(off as i64));
            }
            0x06 => self.restore(c.uleb()?)?, // restore_extended
            0x07 => self.set(c.uleb()?, Rule::Undefined),
            0x08 => self.set(c.uleb()?, Rule::Same),
            0x09 => {
                // register: the value is in another register
                let (reg, _) = (c.uleb()?, c.uleb()?);
                self.set(reg, Rule::Unknown);
            }
            0x0a => {
                // remember_state
                *self.saved.get_mut(self.depth)? = Some(self.row);
                self.depth += 1;
            }
            0x0b => {
                // restore_state: the CFA rule too (gcc's epilogues in the
                // middle of a function rely on it, as libgcc does)
                self.depth = self.depth.checked_sub(1)?;
                self.row = self.saved[self.depth]?;
            }
            0x0c => {
                let (reg, off) = (c.uleb()?, c.uleb()?);
                self.def_cfa(reg, i64::try_from(off).ok()?);
            }
            0x0d => {
                self.row.cfa_reg = c.uleb()?;
                self.row.cfa_unknown = false;
            }
            0x0e => self.row.cfa_off = i64::try_from(c.uleb()?).ok()?,
            0x0f => {
                // def_cfa_expression
                let n = c.uleb()?;
                c.skip(n)?;
                self.row.cfa_unknown = true;
            }
            0x10 | 0x16 => {
                // expression, val_expression
                let reg = c.uleb()?;
                let n = c.uleb()?;
                c.skip(n)?;
                self.set(reg, Rule::Unknown);
            }
            0x11 => {
                // offset_extended_sf
                let (reg, off) = (c.uleb()?, c.sleb()?);
                self.set(reg, self.at(off));
            }
            0x12 => {
                // def_cfa_sf
                let (reg, off) = (c.uleb()?, c.sleb()?);
                self.def_cfa(reg, off.checked_mul(self.cie.data_align)?);
            }
            0x13 => self.row.cfa_off = c.sleb()?.checked_mul(self.cie.data_align)?,
            0x14 => {
                // val_offset: the value is CFA + n, not saved there
                let (reg, _) = (c.uleb()?, c.uleb()?);
                self.set(reg, Rule::Unknown);
            }
            0x15 => {
                // val_offset_sf
                let (reg, _) = (c.uleb()?, c.sleb()?);
                self.set(reg, Rule::Unknown);
            }
            0x2e => {
                c.uleb()?; // GNU_args_size
            }
            0x2f => {
                // GNU_negative_offset_extended
                let (reg, off) = (c.uleb()?, c.uleb()?);
                self.set(reg, self.at(-i64::try_from(off).ok()?));
            }
            _ => return None, // set_loc and anything unknown
        }
        Some(None)
    }
}

/// The FDE covering `pc` in the `.eh_frame_hdr` at `hdr` (its search
/// table binary-searched), within `mem`.
pub(crate) fn find_fde(mem: Mem, hdr: usize, pc: usize) -> Option<usize> {
    let mut c = Cursor::new(mem, hdr, mem.hi)?;
    let [version, ptr_enc, count_enc, table_enc] = c.bytes::<4>()?;
    // Every linker writes a table of (initial location, FDE) pairs as
    // 4-byte offsets from the header (datarel | sdata4).
    if version != 1 || table_enc != 0x3b {
        return None;
    }
    c.encoded(ptr_enc, hdr)?;
    let count = c.encoded(count_enc, hdr)?;
    let table = c.pos;
    if count == 0 || !mem.has(table, count.checked_mul(8)?) {
        return None;
    }
    let entry = |i: usize| -> Option<(usize, usize)> {
        let e: [u8; 8] = mem.read(table + 8 * i)?;
        let loc = i32::from_le_bytes([e[0], e[1], e[2], e[3]]) as isize;
        let fde = i32::from_le_bytes([e[4], e[5], e[6], e[7]]) as isize;
        Some((hdr.wrapping_add_signed(loc), hdr.wrapping_add_signed(fde)))
    };
    // The last entry whose location is at or below pc.
    let (mut lo, mut hi) = (0, count);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if entry(mid)?.0 <= pc {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (loc, fde) = entry(lo)?;
    (loc <= pc).then_some(fde)
}

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
        let Some(row) = find_fde(o.mem, o.hdr, at).and_then(|f| row_for(o.mem, f, at)) else {
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
