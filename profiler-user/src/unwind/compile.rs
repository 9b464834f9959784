//! `.eh_frame` / `.debug_frame` → a sorted table of [`UnwindRow`]s.
//!
//! The file is hostile input: it is read by bounded positioned reads of the
//! ELF header, the program and section headers, the section names and the
//! two CFI sections only ([`Limits::max_read`] bytes in all); every offset
//! is checked against the file's length; gimli parses the CFI with checked
//! reads. A malformed CIE or FDE skips that FDE (counted in
//! [`TableStats::skipped_fdes`]); only a file that is not a readable x86-64
//! ELF, a table over [`Limits::max_rows`], or CFI over its work budget is
//! an error. (An entry whose length header is broken ends its section:
//! nothing after it can be found; it counts as one skipped FDE.)
//!
//! The work budget: gimli runs a CIE's initial instructions again for every
//! FDE that uses it, so one long CIE shared by many FDEs costs time
//! quadratic in the section's size (a 1 MiB section of one CIE of 512k
//! `DW_CFA_nop`s under 22k FDEs took 11.6 s). Before gimli evaluates an FDE,
//! its steps are counted ([`TableStats::work`]): every instruction of its CIE
//! (counted once per CIE, charged per FDE) and of its own is a step, and one
//! that copies or searches the register rules (remembering a state, setting
//! a rule, a new row) a step more per rule held, since gimli's cost grows
//! with them (a state remembered with 100 rules costs 80 times a nop). Past [`Limits::work_per_byte`] × the CFI's size (at most
//! [`Limits::max_work`]) the file is refused. Real files take 1.3–1.6 steps
//! per byte. A CIE's header is parsed once per CIE, not per FDE.
//!
//! How each CFI row becomes an [`UnwindRow`]:
//! - CFA = rsp + off → [`cfa::RSP`]; rbp + off → [`cfa::RBP`]; the PLT
//!   expression `rsp + off + (((rip & 15) >= 11) << 3)` → [`cfa::PLT`]; any
//!   other register or expression, or an offset outside `i32` → [`cfa::UNKNOWN`].
//! - The return address must be at CFA − 8 (`Offset(-8)`); `Undefined` marks
//!   the outermost frame ([`cfa::END`]); any other rule → `UNKNOWN`.
//! - rbp: `Offset(n)` with `n` in `i16` → [`rbp::AT_CFA`]; no rule or
//!   `SameValue` → [`rbp::SAME`]; anything else makes the row `UNKNOWN`.
//! - Signal trampolines (CIE augmentation `S`, e.g. `__restore_rt`) → `UNKNOWN`:
//!   the kernel walk stops there cleanly.
//!
//! Assembling the table: FDEs are sorted by start address; each FDE's rows
//! are followed by an `UNKNOWN` row at its end, so a pc between FDEs finds no
//! rule rather than the previous function's. Overlapping FDEs (rare: hand-written
//! assembly): the one that starts later wins from its start on,
//! the earlier one is cut there (equal starts: the narrower wins); where the
//! later one ends, the table says `UNKNOWN` even if the earlier one extended
//! further. `.debug_frame` FDEs are used only where no `.eh_frame` FDE
//! overlaps them (it adds code that has no `.eh_frame`, e.g. files built with
//! `-fno-asynchronous-unwind-tables -g`). FDEs outside every executable
//! `PT_LOAD` (discarded sections' FDEs at address 0) are dropped and counted.
//! Rows at one pc: the last written wins; consecutive rows with the same rule
//! are merged.

mod assemble;
mod elf_read;
mod fdes;
mod rules;
mod work;

use std::fs::File;
use std::path::{Path, PathBuf};

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use object::LittleEndian as LE;
use object::elf;
use profiler_common::unwind::UnwindRow;
// The module docs' links.
#[cfg(doc)]
use profiler_common::unwind::{cfa, rbp};
use thiserror::Error;

use self::assemble::{assemble, frame_pointer_runs, overlaps};
use self::elf_read::{Reader_, Source, cfi_sections, load_segments, unsupported};
use self::fdes::{Fde, collect_fdes};
use self::work::Work;

/// Bounds on the work and memory one file may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Rows in one file's table; more is [`ErrorKind::TooManyRows`].
    pub max_rows: usize,
    /// Bytes read from one file (headers and CFI sections together).
    pub max_read: u64,
    /// Steps allowed per byte of CFI (see [`TableStats::work`]); more is
    /// [`ErrorKind::TooMuchWork`].
    pub work_per_byte: u64,
    /// Steps allowed in one file, whatever its size.
    pub max_work: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_rows: 1 << 21,
            max_read: 256 << 20,
            work_per_byte: WORK_PER_BYTE,
            max_work: 1 << 28,
        }
    }
}

/// Real files take 1.3–1.6 steps per byte of CFI (python3, libc, libstdc++,
/// cc1, libLLVM: tests/unwind_tables.rs); this leaves room fivefold.
const WORK_PER_BYTE: u64 = 8;

/// What building one table cost and found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Rows in the table (each `size_of::<UnwindRow>()` = 16 bytes).
    pub rows: usize,
    /// FDEs whose rows are in the table.
    pub fdes: usize,
    /// FDEs (or CIEs, counted once) that could not be parsed or evaluated.
    pub skipped_fdes: usize,
    /// FDEs dropped because they lie outside every executable segment, or
    /// (from `.debug_frame`) overlap an `.eh_frame` FDE.
    pub unused_fdes: usize,
    /// FDEs taken from `.debug_frame`.
    pub debug_frame_fdes: usize,
    /// Bytes read from the file.
    pub bytes_read: u64,
    /// Steps of CFI evaluation (see the module docs): each FDE's and its
    /// CIE's, again for every FDE (gimli runs the CIE's instructions each
    /// time).
    pub work: u64,
}

/// One `PT_LOAD` segment: how file offsets map to file virtual addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub executable: bool,
}

/// A file's compiled unwind table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwindTable {
    /// Sorted by `pc`, strictly increasing; see the module docs.
    pub rows: Vec<UnwindRow>,
    /// The file's `PT_LOAD` segments, to compute a mapping's bias.
    pub loads: Vec<LoadSegment>,
    pub stats: TableStats,
    /// Every function keeps a frame pointer: each FDE has a row where
    /// CFA = rbp + 16 with rbp saved at CFA − 16, exactly the frame-pointer
    /// step (see `Fde::keeps_frame_pointer` for the FDEs exempt).
    pub frame_pointers: bool,
    /// Where a return address is one frame-pointer step from its caller's:
    /// the runs of consecutive functions (file virtual addresses, sorted)
    /// that keep a frame pointer, at most [`MAX_FRAME_POINTER_RUNS`] (a
    /// file with more, mostly without frame pointers, lists none). Stacks
    /// walked by frame pointers before a process's tables were in are
    /// vouched for with it (see `session::unwinding`).
    pub frame_pointer_runs: Vec<(u64, u64)>,
}

/// Runs of functions with frame pointers listed per file at most (16 bytes
/// each).
pub const MAX_FRAME_POINTER_RUNS: usize = 4096;

impl UnwindTable {
    /// The bias of a mapping of this file at `start` with file offset
    /// `offset` (as `/proc/PID/maps` gives them): address − bias = file
    /// virtual address. The segment is the one whose pages hold `offset`
    /// (a mapping starts at its segment's `p_offset` rounded down to a
    /// 4 KiB page), an executable one first when two share a page (as
    /// lld lays them out); `None` if no `PT_LOAD` holds `offset`.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        bias(&self.loads, start, offset)
    }
}

/// [`UnwindTable::bias`] from the file's `PT_LOAD` segments alone.
pub fn bias(loads: &[LoadSegment], start: u64, offset: u64) -> Option<u64> {
    let holds = |l: &&LoadSegment| {
        offset >= l.offset & !PAGE_MASK && offset < l.offset.saturating_add(l.filesz.max(1))
    };
    let load =
        (loads.iter().filter(|l| l.executable).find(holds)).or_else(|| loads.iter().find(holds))?;
    let vaddr = offset.wrapping_sub(load.offset).wrapping_add(load.vaddr);
    Some(start.wrapping_sub(vaddr))
}

const PAGE_MASK: u64 = 0xfff;

/// Why a file has no table.
#[derive(Debug, Error)]
#[error("unwind table of {file}: {kind}", file = file.display())]
pub struct CompileError {
    /// The file, as the caller named it.
    pub file: PathBuf,
    #[source]
    pub kind: ErrorKind,
}

#[derive(Debug, Error)]
pub enum ErrorKind {
    #[error("reading the file: {0}")]
    Read(#[source] std::io::Error),
    #[error("not an ELF file")]
    NotElf,
    #[error("unsupported ELF {what} {value:#x} (only 64-bit little-endian x86-64)")]
    Unsupported { what: &'static str, value: u64 },
    #[error("truncated ELF: {what} at {offset:#x} needs {needed:#x} bytes past the file's end")]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
    },
    #[error("{what} ({size:#x} bytes) would pass the {limit:#x} bytes read per file")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error(
        "its call-frame information would take over {limit} steps to evaluate, for {cfi} \
         bytes (a CIE's instructions run again for every FDE: a crafted file?)"
    )]
    TooMuchWork { limit: u64, cfi: u64 },
    #[error("the table has {rows}{more} rows, over the limit of {limit}", more = if *.at_least { " or more" } else { "" })]
    TooManyRows {
        rows: usize,
        at_least: bool,
        limit: usize,
    },
}

/// Compiles the table of the file at `path`.
pub fn compile_file(path: &Path, limits: &Limits) -> Result<UnwindTable, CompileError> {
    let file = File::open(path).map_err(|e| CompileError {
        file: path.to_owned(),
        kind: ErrorKind::Read(e),
    })?;
    compile_open_file(&file, path, limits)
}

/// Compiles the table of an open file; `name` is only for the error.
pub(crate) fn compile_open_file(
    file: &File,
    name: &Path,
    limits: &Limits,
) -> Result<UnwindTable, CompileError> {
    let wrap = |kind| CompileError {
        file: name.to_owned(),
        kind,
    };
    let len = file.metadata().map_err(|e| wrap(ErrorKind::Read(e)))?.len();
    compile(
        Reader_::new(Source::File(file), len, limits.max_read),
        limits,
    )
    .map_err(wrap)
}

/// Compiles the table of an ELF image in memory (tests, fuzzing).
pub fn compile_elf(data: &[u8], name: &Path, limits: &Limits) -> Result<UnwindTable, CompileError> {
    compile(
        Reader_::new(Source::Bytes(data), data.len() as u64, limits.max_read),
        limits,
    )
    .map_err(|kind| CompileError {
        file: name.to_owned(),
        kind,
    })
}

fn compile(mut r: Reader_<'_>, limits: &Limits) -> Result<UnwindTable, ErrorKind> {
    let header: Vec<elf::FileHeader64<LE>> = r.table(0, 1, "ELF header")?;
    let h = &header[0];
    if h.e_ident.magic != elf::ELFMAG {
        return Err(ErrorKind::NotElf);
    }
    if h.e_ident.class != elf::ELFCLASS64 {
        return Err(unsupported("class", h.e_ident.class));
    }
    if h.e_ident.data != elf::ELFDATA2LSB {
        return Err(unsupported("data encoding", h.e_ident.data));
    }
    let machine = h.e_machine.get(LE);
    if machine != elf::EM_X86_64 {
        return Err(unsupported("machine", machine));
    }
    let loads = load_segments(&mut r, h)?;
    let (eh_frame, debug_frame) = cfi_sections(&mut r, h)?;

    let mut stats = TableStats::default();
    let cfi = [&eh_frame, &debug_frame]
        .iter()
        .filter_map(|s| s.as_ref().map(|s| s.data.len() as u64))
        .sum::<u64>();
    let mut work = Work {
        done: 0,
        limit: cfi
            .saturating_mul(limits.work_per_byte)
            .min(limits.max_work),
        cfi,
    };
    let mut fdes = Vec::new();
    // Raw rows (24 bytes each) and FDEs kept before merging: bounded (every
    // FDE has a row). Merging rarely removes more than it adds (one gap row
    // per FDE), so a file over this is over `max_rows` too.
    let mut budget = limits
        .max_rows
        .saturating_add(limits.max_rows / 4)
        .saturating_add(1024);
    if let Some(s) = &eh_frame {
        let mut section = EhFrame::new(&s.data, LittleEndian);
        section.set_address_size(8);
        let bases = BaseAddresses::default().set_eh_frame(s.addr);
        collect_fdes(
            &section,
            &bases,
            &mut fdes,
            &mut stats,
            &mut budget,
            &mut work,
            limits,
        )?;
    }
    if let Some(s) = &debug_frame {
        let mut section = DebugFrame::new(&s.data, LittleEndian);
        section.set_address_size(8);
        let mut extra = Vec::new();
        collect_fdes(
            &section,
            &BaseAddresses::default(),
            &mut extra,
            &mut stats,
            &mut budget,
            &mut work,
            limits,
        )?;
        let mut covered: Vec<(u64, u64)> = fdes.iter().map(|f| (f.start, f.end)).collect();
        covered.sort_unstable();
        let reach: Vec<u64> = covered
            .iter()
            .scan(0, |max, &(_, end)| {
                *max = end.max(*max);
                Some(*max)
            })
            .collect();
        for fde in extra {
            if overlaps(&covered, &reach, fde.start, fde.end) {
                stats.unused_fdes += 1;
            } else {
                stats.debug_frame_fdes += 1;
                fdes.push(fde);
            }
        }
    }
    // Code lives in executable segments; FDEs elsewhere are stale. (A
    // binary search: a hostile file may have 65535 segments.)
    let mut exec: Vec<(u64, u64)> = loads
        .iter()
        .filter(|l| l.executable)
        .map(|l| (l.vaddr, l.vaddr.saturating_add(l.memsz)))
        .collect();
    exec.sort_unstable();
    let before = fdes.len();
    fdes.retain(|f| {
        let i = exec.partition_point(|&(lo, _)| lo <= f.start);
        i > 0 && f.end <= exec[i - 1].1
    });
    stats.unused_fdes += before - fdes.len();
    stats.fdes = fdes.len();

    let frame_pointers = !fdes.is_empty() && fdes.iter().all(Fde::keeps_frame_pointer);
    let frame_pointer_runs = frame_pointer_runs(&mut fdes);
    let rows = assemble(fdes);
    if rows.len() > limits.max_rows {
        return Err(ErrorKind::TooManyRows {
            rows: rows.len(),
            at_least: false,
            limit: limits.max_rows,
        });
    }
    stats.rows = rows.len();
    stats.bytes_read = r.read_bytes();
    stats.work = work.done;
    Ok(UnwindTable {
        rows,
        loads,
        stats,
        frame_pointers,
        frame_pointer_runs,
    })
}

#[cfg(test)]
mod tests;
