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

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Reader,
    Register, RegisterRule, UnwindContext, UnwindSection, UnwindTableRow, X86_64,
};
use object::LittleEndian as LE;
use object::elf;
use object::pod::{self, Pod};
use profiler_common::unwind::{UnwindRow, cfa, rbp};
use thiserror::Error;

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

enum Source<'a> {
    Bytes(&'a [u8]),
    File(&'a File),
}

/// Bounded positioned reads, each checked against the length and charged to
/// the budget.
struct Reader_<'a> {
    source: Source<'a>,
    len: u64,
    budget: u64,
    limit: u64,
}

impl<'a> Reader_<'a> {
    fn new(source: Source<'a>, len: u64, limit: u64) -> Self {
        Reader_ {
            source,
            len,
            budget: limit,
            limit,
        }
    }

    fn read(&mut self, offset: u64, len: u64, what: &'static str) -> Result<Vec<u8>, ErrorKind> {
        let truncated = ErrorKind::Truncated {
            what,
            offset,
            needed: len,
        };
        let end = match offset.checked_add(len) {
            Some(end) if end <= self.len => end,
            _ => return Err(truncated),
        };
        if len > self.budget {
            return Err(ErrorKind::TooLarge {
                what,
                size: len,
                limit: self.limit,
            });
        }
        self.budget -= len;
        match self.source {
            // Both bounds are ≤ data.len(), so they fit in usize.
            Source::Bytes(data) => Ok(data[offset as usize..end as usize].to_vec()),
            Source::File(file) => {
                // len ≤ the budget, which was allocated for.
                let mut buf = vec![0; len as usize];
                match file.read_exact_at(&mut buf, offset) {
                    Ok(()) => Ok(buf),
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(truncated),
                    Err(e) => Err(ErrorKind::Read(e)),
                }
            }
        }
    }

    fn table<T: Pod + Copy>(
        &mut self,
        offset: u64,
        count: u64,
        what: &'static str,
    ) -> Result<Vec<T>, ErrorKind> {
        let len = count.saturating_mul(size_of::<T>() as u64);
        let bytes = self.read(offset, len, what)?;
        // object's ELF structs have alignment 1, so this cannot fail; mapped
        // rather than unwrapped all the same.
        pod::slice_from_all_bytes::<T>(&bytes)
            .map(<[T]>::to_vec)
            .map_err(|_| ErrorKind::Truncated {
                what,
                offset,
                needed: len,
            })
    }

    fn read_bytes(&self) -> u64 {
        self.limit - self.budget
    }
}

/// A CFI section: its address (for pc-relative encodings) and bytes.
struct Section {
    addr: u64,
    data: Vec<u8>,
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

/// The runs of consecutive FDEs (by address) that keep a frame pointer;
/// none past [`MAX_FRAME_POINTER_RUNS`].
fn frame_pointer_runs(fdes: &mut [Fde]) -> Vec<(u64, u64)> {
    fdes.sort_unstable_by_key(|f| f.start);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut open = false;
    for f in fdes.iter() {
        if !f.keeps_frame_pointer() {
            open = false;
            continue;
        }
        match runs.last_mut() {
            Some(run) if open => run.1 = run.1.max(f.end),
            _ => {
                if runs.len() == MAX_FRAME_POINTER_RUNS {
                    return Vec::new();
                }
                runs.push((f.start, f.end));
                open = true;
            }
        }
    }
    runs
}

fn unsupported(what: &'static str, value: impl Into<u64>) -> ErrorKind {
    ErrorKind::Unsupported {
        what,
        value: value.into(),
    }
}

fn load_segments(
    r: &mut Reader_<'_>,
    h: &elf::FileHeader64<LE>,
) -> Result<Vec<LoadSegment>, ErrorKind> {
    let phoff = h.e_phoff.get(LE);
    let phnum = u64::from(h.e_phnum.get(LE));
    if phoff == 0 || phnum == 0 {
        return Ok(Vec::new());
    }
    if usize::from(h.e_phentsize.get(LE)) != size_of::<elf::ProgramHeader64<LE>>() {
        return Err(unsupported("program header size", h.e_phentsize.get(LE)));
    }
    let phdrs: Vec<elf::ProgramHeader64<LE>> = r.table(phoff, phnum, "program headers")?;
    Ok(phdrs
        .iter()
        .filter(|p| p.p_type.get(LE) == elf::PT_LOAD)
        .map(|p| LoadSegment {
            offset: p.p_offset.get(LE),
            vaddr: p.p_vaddr.get(LE),
            filesz: p.p_filesz.get(LE),
            memsz: p.p_memsz.get(LE),
            executable: p.p_flags.get(LE) & elf::PF_X != 0,
        })
        .collect())
}

/// `.eh_frame` and `.debug_frame`, if present, read whole (bounded). A
/// compressed or `SHT_NOBITS` section (split debug info) is ignored.
fn cfi_sections(
    r: &mut Reader_<'_>,
    h: &elf::FileHeader64<LE>,
) -> Result<(Option<Section>, Option<Section>), ErrorKind> {
    let shoff = h.e_shoff.get(LE);
    let mut shnum = u64::from(h.e_shnum.get(LE));
    if shoff == 0 {
        return Ok((None, None));
    }
    if usize::from(h.e_shentsize.get(LE)) != size_of::<elf::SectionHeader64<LE>>() {
        return Err(unsupported("section header size", h.e_shentsize.get(LE)));
    }
    let first: Vec<elf::SectionHeader64<LE>> = r.table(shoff, 1, "section header 0")?;
    if shnum == 0 {
        // More than 0xff00 sections: the count is in section 0's size.
        shnum = first[0].sh_size.get(LE);
    }
    let shdrs: Vec<elf::SectionHeader64<LE>> = r.table(shoff, shnum, "section headers")?;
    let mut strndx = u64::from(h.e_shstrndx.get(LE));
    if strndx == u64::from(elf::SHN_XINDEX) {
        strndx = u64::from(first[0].sh_link.get(LE));
    }
    let Some(strtab) = usize::try_from(strndx).ok().and_then(|i| shdrs.get(i)) else {
        return Ok((None, None));
    };
    let names = r.read(
        strtab.sh_offset.get(LE),
        strtab.sh_size.get(LE),
        "section names",
    )?;
    let name_of = |s: &elf::SectionHeader64<LE>| -> &[u8] {
        let start = s.sh_name.get(LE) as usize;
        let rest = names.get(start..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    };
    let read = |r: &mut Reader_<'_>, want: &[u8], what| -> Result<Option<Section>, ErrorKind> {
        let Some(s) = shdrs.iter().find(|s| name_of(s) == want) else {
            return Ok(None);
        };
        if s.sh_type.get(LE) == elf::SHT_NOBITS
            || s.sh_flags.get(LE) & u64::from(elf::SHF_COMPRESSED) != 0
        {
            return Ok(None);
        }
        let data = r.read(s.sh_offset.get(LE), s.sh_size.get(LE), what)?;
        Ok(Some(Section {
            addr: s.sh_addr.get(LE),
            data,
        }))
    };
    let eh = read(r, b".eh_frame", ".eh_frame")?;
    let debug = read(r, b".debug_frame", ".debug_frame")?;
    Ok((eh, debug))
}

/// Whether `start..end` overlaps one of the intervals, given sorted by
/// start with `reach[i]` = the largest end among the first `i + 1`.
fn overlaps(sorted: &[(u64, u64)], reach: &[u64], start: u64, end: u64) -> bool {
    let i = sorted.partition_point(|&(s, _)| s < end);
    i > 0 && reach[i - 1] > start
}

/// The rule part of a row (everything but the pc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    cfa_rule: u8,
    cfa_offset: i32,
    rbp_rule: u8,
    rbp_offset: i16,
}

const UNKNOWN: Rule = Rule {
    cfa_rule: cfa::UNKNOWN,
    cfa_offset: 0,
    rbp_rule: rbp::SAME,
    rbp_offset: 0,
};

const END: Rule = Rule {
    cfa_rule: cfa::END,
    cfa_offset: 0,
    rbp_rule: rbp::SAME,
    rbp_offset: 0,
};

struct Fde {
    start: u64,
    end: u64,
    rows: Vec<(u64, Rule)>,
}

impl Fde {
    fn keeps_frame_pointer(&self) -> bool {
        let frame_pointer = |r: &Rule| {
            r.cfa_rule == cfa::RBP
                && r.cfa_offset == 16
                && r.rbp_rule == rbp::AT_CFA
                && r.rbp_offset == -16
        };
        // No return address is ever in these: outermost frames (`_start`:
        // the walk ends there, and its rbp of 0 fails a frame-pointer step)
        // and code that never moves the stack (PLT stubs, `.plt.got`
        // entries: a call needs an aligned stack, so they make none).
        let outermost_or_plt = |r: &Rule| r.cfa_rule == cfa::END || r.cfa_rule == cfa::PLT;
        let still = |r: &Rule| r.cfa_rule == cfa::RSP && r.cfa_offset == 8;
        self.rows
            .iter()
            .any(|(_, r)| frame_pointer(r) || outermost_or_plt(r))
            || self.rows.iter().all(|(_, r)| still(r))
    }
}

type R<'a> = EndianSlice<'a, LittleEndian>;

/// The CFI evaluated so far and what the file may cost (module docs).
struct Work {
    done: u64,
    limit: u64,
    /// Bytes of CFI in the file, for the error.
    cfi: u64,
}

impl Work {
    fn charge(&mut self, bytes: u64) -> Result<(), ErrorKind> {
        self.done = self.done.saturating_add(bytes);
        if self.done > self.limit {
            return Err(ErrorKind::TooMuchWork {
                limit: self.limit,
                cfi: self.cfi,
            });
        }
        Ok(())
    }
}

/// What a CFI program costs gimli to run, from the rules held before it.
#[derive(Clone, Copy, Debug, Default)]
struct Steps {
    steps: u64,
    /// Registers 0–127 with a rule (x86-64's are 0–16 and a few more).
    low: u128,
    /// Rules of higher registers: over-estimated (never taken away).
    high: u64,
}

impl Steps {
    /// Rules held (gimli holds at most 192).
    fn rules(&self) -> u64 {
        (u64::from(self.low.count_ones()) + self.high).min(192)
    }

    /// Counts `program` on (a malformed instruction ends it, as it ends
    /// gimli's run).
    fn of(mut self, mut program: gimli::CallFrameInstructionIter<'_, R<'_>>) -> Steps {
        use gimli::CallFrameInstruction as I;
        // States remembered in this program (gimli keeps at most 4 rows).
        let mut saved: Vec<(u128, u64)> = Vec::new();
        while let Ok(Some(instruction)) = program.next() {
            self.steps += match instruction {
                I::Nop
                | I::DefCfa { .. }
                | I::DefCfaSf { .. }
                | I::DefCfaRegister { .. }
                | I::DefCfaOffset { .. }
                | I::DefCfaOffsetSf { .. }
                | I::DefCfaExpression { .. }
                | I::ArgsSize { .. } => 1,
                // The rules are looked up (a new row), copied (a state
                // remembered), dropped (restored) or searched (set).
                _ => 1 + self.rules(),
            };
            match instruction {
                I::RememberState if saved.len() < 4 => saved.push((self.low, self.high)),
                I::RestoreState => {
                    if let Some((low, high)) = saved.pop() {
                        (self.low, self.high) = (low, high);
                    }
                }
                I::Undefined { register } if register.0 < 128 => {
                    self.low &= !(1 << register.0);
                }
                I::SameValue { register }
                | I::Offset { register, .. }
                | I::OffsetExtendedSf { register, .. }
                | I::ValOffset { register, .. }
                | I::ValOffsetSf { register, .. }
                | I::Register {
                    dest_register: register,
                    ..
                }
                | I::Expression { register, .. }
                | I::ValExpression { register, .. }
                | I::Restore { register } => {
                    if register.0 < 128 {
                        self.low |= 1 << register.0;
                    } else {
                        self.high += 1;
                    }
                }
                _ => {}
            }
        }
        self
    }
}

#[allow(clippy::too_many_arguments)]
fn collect_fdes<'a, S: UnwindSection<R<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    out: &mut Vec<Fde>,
    stats: &mut TableStats,
    budget: &mut usize,
    work: &mut Work,
    limits: &Limits,
) -> Result<(), ErrorKind> {
    let mut ctx = Box::new(UnwindContext::new());
    // Each CIE parsed once (its header, e.g. a long augmentation string,
    // would otherwise be scanned again for every FDE).
    let mut cies: HashMap<usize, gimli::Result<gimli::CommonInformationEntry<R<'a>>>> =
        HashMap::new();
    // Each CIE's steps and the rules it leaves, counted once.
    let mut cie_steps: HashMap<usize, Steps> = HashMap::new();
    let mut entries = section.entries(bases);
    loop {
        let partial = match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => partial,
            Ok(Some(CieOrFde::Cie(_))) => continue,
            Ok(None) => break,
            // A broken entry header: its length is unknown, nothing after
            // it can be found.
            Err(_) => {
                stats.skipped_fdes += 1;
                break;
            }
        };
        let Ok(fde) = partial.parse(|s, b, o| {
            cies.entry(gimli::UnwindOffset::into(o))
                .or_insert_with(|| s.cie_from_offset(b, o))
                .clone()
        }) else {
            stats.skipped_fdes += 1;
            continue;
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            stats.skipped_fdes += 1;
            continue;
        };
        if start == end {
            continue;
        }
        let mut rows = Vec::new();
        if fde.is_signal_trampoline() {
            if *budget == 0 {
                return Err(over_budget(out, 0, limits));
            }
            *budget -= 1;
            rows.push((start, UNKNOWN));
        } else {
            // Before gimli runs the CIE's instructions again.
            let cie = *cie_steps
                .entry(fde.cie().offset())
                .or_insert_with(|| Steps::default().of(fde.cie().instructions(section, bases)));
            // And the initial rules saved, and the last row.
            let fde_steps = Steps {
                steps: 2 * (1 + cie.rules()),
                ..cie
            }
            .of(fde.instructions(section, bases));
            work.charge(cie.steps.saturating_add(fde_steps.steps))?;
            let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
                stats.skipped_fdes += 1;
                continue;
            };
            let mut failed = false;
            loop {
                match table.next_row() {
                    Ok(Some(row)) => {
                        if *budget == 0 {
                            return Err(over_budget(out, rows.len(), limits));
                        }
                        *budget -= 1;
                        rows.push((row.start_address(), rule_of(row, section)));
                    }
                    Ok(None) => break,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                stats.skipped_fdes += 1;
                continue;
            }
        }
        out.push(Fde { start, end, rows });
    }
    Ok(())
}

fn over_budget(fdes: &[Fde], more: usize, limits: &Limits) -> ErrorKind {
    ErrorKind::TooManyRows {
        rows: fdes.iter().map(|f| f.rows.len()).sum::<usize>() + more,
        at_least: true,
        limit: limits.max_rows,
    }
}

/// `DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`: what follows `DW_OP_breg7 off` in the
/// PLT's CFA expression (GNU ld's `.plt`, as the OpenTelemetry profiler and
/// the Parca agent recognise it).
const PLT_TAIL: [u8; 9] = [0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
const DW_OP_BREG7: u8 = 0x77;

/// The offset of a PLT CFA expression, `None` for any other expression.
fn plt_offset(expr: &[u8]) -> Option<i32> {
    let (&op, rest) = expr.split_first()?;
    if op != DW_OP_BREG7 {
        return None;
    }
    let mut input = EndianSlice::new(rest, LittleEndian);
    let offset = input.read_sleb128().ok()?;
    (input.slice() == PLT_TAIL)
        .then(|| i32::try_from(offset).ok())
        .flatten()
}

fn rule_of<'a, S: UnwindSection<R<'a>>>(row: &UnwindTableRow<usize>, section: &S) -> Rule {
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return END,
        _ => return UNKNOWN,
    }
    let (cfa_rule, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(*offset) else {
                return UNKNOWN;
            };
            match *register {
                X86_64::RSP => (cfa::RSP, offset),
                X86_64::RBP => (cfa::RBP, offset),
                Register(_) => return UNKNOWN,
            }
        }
        CfaRule::Expression(e) => {
            let Some(offset) = e.get(section).ok().and_then(|e| plt_offset(e.0.slice())) else {
                return UNKNOWN;
            };
            (cfa::PLT, offset)
        }
    };
    let (rbp_rule, rbp_offset) = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => (rbp::SAME, 0),
        Some(RegisterRule::Offset(n)) => match i16::try_from(n) {
            Ok(n) => (rbp::AT_CFA, n),
            Err(_) => return UNKNOWN,
        },
        Some(_) => return UNKNOWN,
    };
    Rule {
        cfa_rule,
        cfa_offset,
        rbp_rule,
        rbp_offset,
    }
}

/// Appends a row keeping the table sorted and merged: rows at or past `pc`
/// are replaced (the last written wins), a row with its predecessor's rule
/// is not added.
fn push(rows: &mut Vec<UnwindRow>, pc: u64, rule: Rule) {
    let row = UnwindRow {
        pc,
        cfa_offset: rule.cfa_offset,
        rbp_offset: rule.rbp_offset,
        cfa_rule: rule.cfa_rule,
        rbp_rule: rule.rbp_rule,
    };
    while rows.last().is_some_and(|last| last.pc >= pc) {
        rows.pop();
    }
    if rows
        .last()
        .is_some_and(|last| UnwindRow { pc, ..*last } == row)
    {
        return;
    }
    rows.push(row);
}

/// The table of the FDEs (see the module docs for overlaps). Its length is
/// at most the FDEs' rows plus one per FDE.
fn assemble(mut fdes: Vec<Fde>) -> Vec<UnwindRow> {
    // By start; equal starts: the wider first, so the narrower is written last and wins.
    fdes.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut rows = Vec::new();
    for (i, fde) in fdes.iter().enumerate() {
        // Cut where the next FDE starts (overlap: the later one wins).
        let end = match fdes.get(i + 1) {
            Some(next) if next.start < fde.end => next.start,
            _ => fde.end,
        };
        for &(pc, rule) in &fde.rows {
            if pc >= fde.start && pc < end {
                push(&mut rows, pc, rule);
            }
        }
        if end > fde.start {
            push(&mut rows, end, UNKNOWN);
        }
    }
    rows
}

#[cfg(test)]
mod tests;
