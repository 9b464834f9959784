//! Bounded reads: every read of CFI data or of the stack checks its range.

/// A readable address range: every read checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mem {
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

impl Mem {
    pub(super) fn has(&self, at: usize, len: usize) -> bool {
        at >= self.lo && at.checked_add(len).is_some_and(|e| e <= self.hi)
    }

    pub(super) fn read<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        if !self.has(at, N) {
            return None;
        }
        // SAFETY: [at, at + N) lies in this readable range (checked).
        Some(unsafe { core::ptr::read_unaligned(at as *const [u8; N]) })
    }

    pub(super) fn u32(&self, at: usize) -> Option<u32> {
        self.read(at).map(u32::from_le_bytes)
    }
}

/// A bounded reader over `[pos, end)`, `end` within `mem`.
pub(super) struct Cursor {
    pub(super) mem: Mem,
    pub(super) pos: usize,
    pub(super) end: usize,
}

impl Cursor {
    pub(super) fn new(mem: Mem, pos: usize, end: usize) -> Option<Cursor> {
        (mem.has(pos, 0) && end >= pos && end <= mem.hi).then_some(Cursor { mem, pos, end })
    }

    pub(super) fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        if self.pos.checked_add(N)? > self.end {
            return None;
        }
        let v = self.mem.read::<N>(self.pos)?;
        self.pos += N;
        Some(v)
    }

    pub(super) fn u8(&mut self) -> Option<u8> {
        self.bytes::<1>().map(|b| b[0])
    }

    pub(super) fn uleb(&mut self) -> Option<u64> {
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

    pub(super) fn sleb(&mut self) -> Option<i64> {
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
    pub(super) fn encoded(&mut self, enc: u8, datarel: usize) -> Option<usize> {
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

    pub(super) fn skip(&mut self, n: u64) -> Option<()> {
        let to = self.pos.checked_add(usize::try_from(n).ok()?)?;
        (to <= self.end).then(|| self.pos = to)
    }
}
