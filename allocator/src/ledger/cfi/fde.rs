//! A CIE and its FDE decoded, and their CFA program run up to a pc: the
//! unwind row there. Everything read through [`Mem`]; anything not
//! understood is `None`.

use super::read::{Cursor, Mem};
use super::{MAX_OPS, MAX_STATES, RBP, RSP};

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
