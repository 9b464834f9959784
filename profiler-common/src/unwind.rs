//! Compiled call-frame information: how the kernel finds a frame's caller in
//! code built without frame pointers. User space compiles each mapped file's
//! `.eh_frame` / `.debug_frame` into a table of [`UnwindRow`]s sorted by
//! address (as the OpenTelemetry eBPF profiler's "stack deltas" and the
//! Parca agent's tables); the kernel looks a pc up by binary search and
//! applies the row. x86-64 only: the return address is always at CFA − 8.

/// How to find the CFA (the caller's stack pointer before the call) for the
/// code from [`UnwindRow::pc`] up to the next row's address.
pub mod cfa {
    /// No rule the kernel can apply (no CFI, a DWARF expression, an
    /// unsupported register): the walk ends with a truncation marker.
    pub const UNKNOWN: u8 = 0;
    /// CFA = rsp + offset.
    pub const RSP: u8 = 1;
    /// CFA = rbp + offset.
    pub const RBP: u8 = 2;
    /// A PLT stub: CFA = rsp + offset, plus 8 once the stub has pushed
    /// (`(rip & 15) >= 11`), the one DWARF expression compilers emit for PLTs.
    pub const PLT: u8 = 3;
    /// The outermost frame (the return address is undefined, as in `_start`):
    /// the stack is complete.
    pub const END: u8 = 4;
}

/// Where the caller's rbp is.
pub mod rbp {
    /// rbp is unchanged (the callee did not save it, or has restored it).
    pub const SAME: u8 = 0;
    /// Saved at CFA + `rbp_offset`.
    pub const AT_CFA: u8 = 1;
}

/// One row of a compiled unwind table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// First address the row covers, in the file's virtual address space
    /// (ELF `p_vaddr`s); it covers everything below the next row's `pc`.
    pub pc: u64,
    pub cfa_offset: i32,
    pub rbp_offset: i16,
    /// One of [`cfa`].
    pub cfa_rule: u8,
    /// One of [`rbp`].
    pub rbp_rule: u8,
}

/// Executable mappings with unwind tables per process (sorted by start).
pub const MAX_UNWIND_MAPPINGS: usize = 256;

/// One executable mapping of a process and its file's table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    /// What to subtract from an address to get the file's virtual address.
    pub bias: u64,
    /// The file's rows: `UNWIND_ROWS[rows_start .. rows_start + rows_len]`.
    pub rows_start: u32,
    pub rows_len: u32,
    /// [`FRAME_POINTERS`] or 0.
    pub flags: u32,
    pub _pad: u32,
}

/// [`UnwindMapping::flags`]: every function of the file keeps a frame
/// pointer (its table proves it), so a return address in it is one
/// frame-pointer step from its caller's: no table lookup is needed.
pub const FRAME_POINTERS: u32 = 1;

/// Every mapping with an unwind table of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcUnwind {
    pub len: u32,
    pub _pad: u32,
    /// Unique to this table among all user space gives the kernel (a
    /// session-wide counter from 1): the key of the kernel's row cache, so
    /// a table replaced (a library loaded or unloaded, rows moved) never
    /// meets what was found in the one before.
    pub version: u64,
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

impl Default for ProcUnwind {
    fn default() -> Self {
        ProcUnwind {
            len: 0,
            _pad: 0,
            version: 0,
            mappings: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
        }
    }
}

/// Entries per CPU of the kernel's cache of what a table walk found for a
/// return address (a power of two). 40 KiB per CPU: 10 MiB on a 256-CPU
/// host; a program's sampled stacks go through a few hundred call sites
/// (cc1: ≈ 600).
pub const UNWIND_CACHE_ENTRIES: usize = 1024;

/// [`UnwindCacheEntry::found`]: the address lies in a mapping whose file
/// keeps frame pointers ([`FRAME_POINTERS`]).
pub const CACHED_FRAME_POINTERS: u32 = 1;
/// [`UnwindCacheEntry::row`] is the row covering the address.
pub const CACHED_ROW: u32 = 2;

/// What the mapping and row search found for `at` in table `version`: a
/// walk through a call site seen before skips both binary searches (≈ 30
/// steps over the process's mappings and its file's rows, each a likely
/// cache miss). Version 0 (no table has it) marks an empty entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindCacheEntry {
    pub version: u64,
    pub at: u64,
    pub row: UnwindRow,
    /// `CACHED_*` bits.
    pub found: u32,
    pub _pad: u32,
}

/// The cache entry for `at` in table `version`.
pub const fn unwind_cache_slot(version: u64, at: u64) -> u32 {
    let h = (at ^ version.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - UNWIND_CACHE_ENTRIES.trailing_zeros())) as u32
}

/// A frame address the kernel appends when a walk stops early because a pc
/// had no rule it could apply: user space shows a truncation marker naming
/// the file of the frame before it. No user-space code lives this high.
pub const TRUNCATED_FRAME: u64 = 0xffff_ffff_ffff_fff0;

/// The frame address the kernel writes in place of a stack's 127th frame
/// when the stack goes deeper ([`crate::MAX_STACK_DEPTH`]): user space shows
/// a marker saying the stack was cut there.
pub const DEPTH_CUT_FRAME: u64 = 0xffff_ffff_ffff_ffd0;

/// The frame address the kernel appends to a stack walked by frame pointers
/// because its process had no unwind tables yet (a new process, or one just
/// exec'ed): a return address is only sure while every frame below it kept
/// a frame pointer, so user space keeps the frames up to the first one in a
/// function not known to keep one, and ends the stack there in a marker
/// (all sure: the stack is whole, the marker goes).
pub const NO_TABLES_FRAME: u64 = 0xffff_ffff_ffff_ffc0;

/// As [`NO_TABLES_FRAME`], for such a walk that was also cut at
/// [`crate::MAX_STACK_DEPTH`] (126 frames and this).
pub const NO_TABLES_DEPTH_FRAME: u64 = 0xffff_ffff_ffff_ffb0;

/// Index of the last row whose `pc` is at or below `pc`, in rows sorted by
/// `pc` (what the kernel's binary search computes; `None` below the first).
pub fn find_row(rows: &[UnwindRow], pc: u64) -> Option<usize> {
    let after = rows.partition_point(|r| r.pc <= pc);
    after.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_no_padding() {
        assert_eq!(size_of::<UnwindRow>(), 16);
        assert_eq!(size_of::<UnwindMapping>(), 40);
        assert_eq!(size_of::<ProcUnwind>(), 16 + 40 * MAX_UNWIND_MAPPINGS);
        assert_eq!(size_of::<UnwindCacheEntry>(), 40);
    }

    #[test]
    fn cache_slots_spread_addresses_and_versions() {
        let distinct = |slots: &mut dyn Iterator<Item = u32>| {
            let mut seen = [false; UNWIND_CACHE_ENTRIES];
            slots
                .filter(|&s| !core::mem::replace(&mut seen[s as usize], true))
                .count()
        };
        // Return addresses a few bytes apart, as in one function, and the
        // same address under successive tables, spread over the slots about
        // as random ones would (128 into 1024: ≈ 120 distinct).
        let near =
            distinct(&mut (0..128u64).map(|i| unwind_cache_slot(1, 0x5555_5555_1000 + 5 * i)));
        assert!(near > 100, "{near}");
        let versions = distinct(&mut (1..=64u64).map(|v| unwind_cache_slot(v, 0x7f00_0000_1234)));
        assert!(versions > 55, "{versions}");
    }

    #[test]
    fn a_pc_finds_the_row_that_covers_it() {
        let row = |pc| UnwindRow {
            pc,
            ..UnwindRow::default()
        };
        let rows = [row(0x10), row(0x20), row(0x30)];
        assert_eq!(find_row(&rows, 0x0f), None);
        assert_eq!(find_row(&rows, 0x10), Some(0));
        assert_eq!(find_row(&rows, 0x2f), Some(1));
        assert_eq!(find_row(&rows, 0x1000), Some(2));
    }
}
