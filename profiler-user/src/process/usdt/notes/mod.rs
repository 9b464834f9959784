//! `.note.stapsdt` parsing for 64-bit little-endian x86_64 ELF files.
//!
//! The input may be truncated or hostile, so every offset and size read from
//! the file is checked against its length before use, files are read by
//! positioned reads of just the headers, section names and note areas
//! (at most [`MAX_READ`] bytes per file, so a huge or sparse file costs no
//! more than a small one), address arithmetic is
//! either checked or explicitly wrapping (a wrapped address then simply lies
//! in no segment), every loop advances by at least one fixed-size record,
//! overlapping note areas are rejected and segment lookups are binary
//! searches. Work is therefore O(n log n) in the file size.
//!
//! Note layout (SystemTap SDT v3, <https://sourceware.org/systemtap/wiki/UserSpaceProbeImplementation>):
//! owner `"stapsdt"`, type 3, descriptor = pc, base, semaphore (u64 each),
//! then the NUL-terminated provider, name and argument strings.
//!
//! Files: this one walks the notes; `reader.rs` holds the bounded positioned
//! reads, `headers.rs` the ELF header, section and segment parsing.

mod headers;
mod reader;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};

use object::LittleEndian as LE;
use object::elf;
use profiler_common::{UsdtSpec, backend_stats, ledger};
use thiserror::Error;

use self::headers::{Loads, file_header, name_is, program_headers, section_headers, section_names};
use self::reader::{Reader, Source};
use super::{ArgError, parse_args};

const NOTE_OWNER: &[u8] = b"stapsdt";
const NOTE_TYPE: u32 = 3;
const NOTE_SECTION: &[u8] = b".note.stapsdt";
const BASE_SECTION: &[u8] = b".stapsdt.base";
/// `namesz`, `descsz`, `type`: three u32 in both ELF classes.
const NOTE_HEADER_LEN: u64 = 12;
/// pc, base and semaphore.
const DESC_ADDRS_LEN: usize = 24;

/// Why a file's probes could not be read at all.
#[derive(Debug, Error)]
pub enum NoteError {
    #[error("reading {path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading an open file failed.
    #[error("reading the file: {0}")]
    Read(#[source] std::io::Error),
    #[error("not an ELF file")]
    NotElf,
    /// A structure is larger than any real file has (see [`MAX_READ`]).
    #[error(
        "{what} at {offset:#x} is {size:#x} bytes, more than the {limit:#x} bytes read per file"
    )]
    TooLarge {
        what: &'static str,
        offset: u64,
        size: u64,
        limit: u64,
    },
    /// A well-formed ELF this parser does not handle (only 64-bit
    /// little-endian x86_64 executables and shared objects are).
    #[error("unsupported ELF {what} {value:#x} (only 64-bit little-endian x86_64 ET_EXEC/ET_DYN)")]
    Unsupported { what: &'static str, value: u64 },
    /// A structure extends past the end of the file or of its enclosing area.
    #[error(
        "truncated ELF: {what} at {offset:#x} needs {needed:#x} bytes, {available:#x} available"
    )]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// A structure is inconsistent (bad entry size, missing NUL, overlap...).
    #[error("malformed ELF: {what} (at {offset:#x})")]
    Malformed { what: &'static str, offset: u64 },
}

/// Why a probe address has no file offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum LocateError {
    #[error("address {vaddr:#x} is in no file-backed PT_LOAD segment")]
    NotMapped { vaddr: u64 },
    #[error("address {vaddr:#x} is in a PT_LOAD segment that is not executable")]
    NotExecutable { vaddr: u64 },
    #[error("address {vaddr:#x} maps past the end of the file")]
    BeyondFile { vaddr: u64 },
}

/// One USDT probe site from a `.note.stapsdt` note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsdtProbe {
    /// Probe provider, e.g. `otel_memory` (lossily decoded if not UTF-8).
    pub provider: String,
    /// Probe name, e.g. `alloc` (lossily decoded if not UTF-8).
    pub name: String,
    /// Link-time virtual address of the probe's `nop`, after the
    /// `.stapsdt.base` (prelink) adjustment. For PIE and shared objects it is
    /// relative to the load base.
    pub pc: u64,
    /// File offset of the `nop`, the uprobe attach point; an error when `pc`
    /// is not inside the file-backed part of an executable PT_LOAD segment.
    /// Per probe, so that one bad note does not hide the file's other probes.
    pub file_offset: Result<u64, LocateError>,
    /// Link-time address of the probe's semaphore (adjusted like `pc`), 0 if
    /// none. Probes with a semaphore are attachable; it only gates arguments
    /// that are expensive to compute, and we do not increment it.
    pub semaphore: u64,
    /// File offset of the semaphore; `None` when `semaphore` is 0 or does not
    /// lie in the file-backed part of a PT_LOAD segment.
    pub semaphore_offset: Option<u64>,
    /// The raw argument string, e.g. `8@%rdi -8@%rax -4@%edx`.
    pub args: String,
}

impl UsdtProbe {
    /// Compiles [`UsdtProbe::args`] for the kernel; see [`parse_args`].
    pub fn spec(&self) -> Result<UsdtSpec, ArgError> {
        parse_args(&self.args)
    }
}

/// The most bytes of one file the parser reads (headers, section names and
/// note areas together). Real files need kilobytes; a file that needs more
/// is hostile or not a probe carrier, and fails with [`NoteError::TooLarge`].
pub(crate) const MAX_READ: u64 = 16 << 20;

/// What a file's notes say: its USDT probes and, for `liballocprof*.so`,
/// where its backend-statistics block (`profiler_common::backend_stats`) and
/// live-sample ledger (`profiler_common::ledger`) are.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ElfNotes {
    pub probes: Vec<UsdtProbe>,
    /// File offset of the backend-statistics block; `None` without the
    /// note, or when its address lies in no file-backed PT_LOAD segment.
    pub backend_stats: Option<u64>,
    /// File offset of the live-sample ledger's header
    /// (`profiler_common::ledger`), likewise.
    pub ledger: Option<u64>,
}

/// Link-time addresses the library's `.note.allocprof` notes give.
#[derive(Default)]
struct LibraryBlocks {
    stats: Option<u64>,
    ledger: Option<u64>,
}

/// Opens the file and returns its USDT probes; see [`probes_in_open_file`].
pub fn probes_in_file(path: &Path) -> Result<Vec<UsdtProbe>, NoteError> {
    let io = |source| NoteError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    probes_in_open_file(&file).map_err(|e| match e {
        NoteError::Read(source) => io(source),
        e => e,
    })
}

/// Returns the USDT probes of an open ELF file, reading only its headers,
/// section names and note areas, with bounded positioned reads (at most
/// [`MAX_READ`] bytes in all): a huge or sparse file costs no more than a
/// small one, and a non-ELF file costs one read of its first bytes.
pub(crate) fn probes_in_open_file(file: &File) -> Result<Vec<UsdtProbe>, NoteError> {
    Ok(notes_in_open_file(file)?.probes)
}

/// The notes of an open ELF file, read as [`probes_in_open_file`] does.
pub(crate) fn notes_in_open_file(file: &File) -> Result<ElfNotes, NoteError> {
    let meta = file.metadata().map_err(NoteError::Read)?;
    if !meta.is_file() {
        return Err(NoteError::Read(std::io::Error::other("not a regular file")));
    }
    notes(&mut Reader::new(Source::File(file), meta.len()))
}

/// Returns the USDT probes of an ELF image, in note order; no probes is an
/// empty `Vec`, not an error.
///
/// Notes are found through the section headers (every `.note.stapsdt`
/// section) or, when the file has no section headers, by scanning the
/// `PT_NOTE` segments for `stapsdt` notes; in the latter case there is no
/// `.stapsdt.base` section and addresses are used unadjusted. Any malformed
/// note fails the whole file (as in libbpf): after a bad length nothing
/// that follows can be trusted.
pub fn probes_in_elf(data: &[u8]) -> Result<Vec<UsdtProbe>, NoteError> {
    Ok(notes_in_elf(data)?.probes)
}

/// The notes of an ELF image: its probes and its backend-statistics block.
pub fn notes_in_elf(data: &[u8]) -> Result<ElfNotes, NoteError> {
    notes(&mut Reader::new(Source::Bytes(data), data.len() as u64))
}

fn notes(data: &mut Reader<'_>) -> Result<ElfNotes, NoteError> {
    let header = file_header(data)?;
    let sections = section_headers(data, &header)?;
    let segments = program_headers(data, &header, sections.first())?;

    let mut areas = Vec::new();
    let mut stapsdt_base = None;
    if sections.is_empty() {
        for ph in segments
            .iter()
            .filter(|ph| ph.p_type.get(LE) == elf::PT_NOTE)
        {
            areas.push(NoteArea {
                offset: ph.p_offset.get(LE),
                size: ph.p_filesz.get(LE),
                align: ph.p_align.get(LE),
            });
        }
    } else {
        let names = section_names(data, &header, &sections)?;
        for sh in &sections {
            let name = sh.sh_name.get(LE);
            let noted = name_is(&names, name, NOTE_SECTION)
                || name_is(&names, name, backend_stats::NOTE_SECTION);
            if noted && sh.sh_type.get(LE) != elf::SHT_NOBITS {
                areas.push(NoteArea {
                    offset: sh.sh_offset.get(LE),
                    size: sh.sh_size.get(LE),
                    align: sh.sh_addralign.get(LE),
                });
            } else if stapsdt_base.is_none() && name_is(&names, name, BASE_SECTION) {
                stapsdt_base = Some(sh.sh_addr.get(LE));
            }
        }
    }

    // Overlapping areas (e.g. thousands of PT_NOTE over the same bytes)
    // would let a small file cost quadratic work; valid files have none.
    let mut spans: Vec<(u64, u64)> = areas.iter().map(|a| (a.offset, a.size)).collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((prev_offset, prev_size), (offset, _)) = (pair[0], pair[1]);
        if offset < prev_offset.saturating_add(prev_size) {
            return Err(NoteError::Malformed {
                what: "note sections or segments overlap",
                offset,
            });
        }
    }
    let mut notes = Vec::new();
    let mut blocks = LibraryBlocks::default();
    for area in &areas {
        let bytes = data.read(area.offset, area.size, "note area")?;
        walk_notes(&bytes, area.offset, area.align, &mut notes, &mut blocks)?;
    }

    let loads = Loads::new(&segments);
    let file_len = data.len;
    let backend_stats = blocks
        .stats
        .and_then(|vaddr| loads.data_offset(vaddr, file_len));
    let ledger = blocks
        .ledger
        .and_then(|vaddr| loads.data_offset(vaddr, file_len));
    let probes = notes
        .into_iter()
        .map(|note| {
            // Prelink moves the image but not the (unallocated) notes; the
            // `.stapsdt.base` section moves with it, so the difference between
            // its address and the one recorded in the note is the shift.
            let shift = match stapsdt_base {
                Some(actual) if note.base != 0 => actual.wrapping_sub(note.base),
                _ => 0,
            };
            let pc = note.pc.wrapping_add(shift);
            let semaphore = if note.semaphore == 0 {
                0
            } else {
                note.semaphore.wrapping_add(shift)
            };
            UsdtProbe {
                provider: note.provider,
                name: note.name,
                pc,
                file_offset: loads.code_offset(pc, file_len),
                semaphore,
                semaphore_offset: (semaphore != 0)
                    .then(|| loads.data_offset(semaphore, file_len))
                    .flatten(),
                args: note.args,
            }
        })
        .collect();
    Ok(ElfNotes {
        probes,
        backend_stats,
        ledger,
    })
}

struct NoteArea {
    offset: u64,
    size: u64,
    align: u64,
}

/// A `stapsdt` note's descriptor, addresses as recorded at link time.
struct RawNote {
    pc: u64,
    base: u64,
    semaphore: u64,
    provider: String,
    name: String,
    args: String,
}

/// Appends the `stapsdt` notes of one note area (at file offset
/// `area_offset`) to `out`, and keeps the first backend-statistics and
/// ledger notes' addresses in `blocks`, skipping other notes.
fn walk_notes(
    area: &[u8],
    area_offset: u64,
    align: u64,
    out: &mut Vec<RawNote>,
    blocks: &mut LibraryBlocks,
) -> Result<(), NoteError> {
    // Notes are 4-byte aligned unless the area says 8 (as gABI readers do).
    let align: u64 = if align == 8 { 8 } else { 4 };
    let align_up = |x: u64| (x + (align - 1)) & !(align - 1);
    let len = area.len() as u64;
    let mut pos = 0u64;
    while pos < len {
        // No overflow below: `len`, `pos` ≤ data.len() ≤ isize::MAX and the
        // sizes added are u32.
        let at = area_offset + pos;
        let truncated = |what, needed| NoteError::Truncated {
            what,
            offset: at,
            needed,
            available: len - pos,
        };
        if len - pos < NOTE_HEADER_LEN {
            return Err(truncated("note header", NOTE_HEADER_LEN));
        }
        let p = pos as usize;
        let word = |i: usize| {
            u32::from_le_bytes([
                area[p + i],
                area[p + i + 1],
                area[p + i + 2],
                area[p + i + 3],
            ])
        };
        let (namesz, descsz, kind) = (word(0), word(4), word(8));
        let name_start = pos + NOTE_HEADER_LEN;
        let name_end = name_start + u64::from(namesz);
        let desc_start = align_up(name_end);
        let desc_end = desc_start + u64::from(descsz);
        if desc_end > len {
            return Err(truncated("note", desc_end - pos));
        }
        // In bounds: all ≤ desc_end ≤ len.
        let name = &area[name_start as usize..name_end as usize];
        let owner = name.split(|&b| b == 0).next().unwrap_or_default();
        if kind == NOTE_TYPE && owner == NOTE_OWNER {
            let desc = &area[desc_start as usize..desc_end as usize];
            out.push(parse_desc(desc, area_offset + desc_start)?);
        } else if owner == backend_stats::NOTE_OWNER {
            // One address; a descriptor of any other length is not ours.
            let desc = &area[desc_start as usize..desc_end as usize];
            let slot = match kind {
                backend_stats::NOTE_TYPE => Some(&mut blocks.stats),
                ledger::NOTE_TYPE => Some(&mut blocks.ledger),
                _ => None,
            };
            if let Some(slot) = slot
                && slot.is_none()
                && let Ok(addr) = <[u8; 8]>::try_from(desc)
            {
                *slot = Some(u64::from_le_bytes(addr));
            }
        }
        // The last note's padding may be missing; that is harmless.
        pos = align_up(desc_end).min(len);
    }
    Ok(())
}

fn parse_desc(desc: &[u8], offset: u64) -> Result<RawNote, NoteError> {
    let malformed = |what| NoteError::Malformed { what, offset };
    let (addrs, mut strings) = desc.split_at_checked(DESC_ADDRS_LEN).ok_or(malformed(
        "stapsdt descriptor shorter than its three addresses",
    ))?;
    let addr = |i: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&addrs[i * 8..i * 8 + 8]);
        u64::from_le_bytes(word)
    };
    let mut next_string = |what| {
        let nul = strings
            .iter()
            .position(|&b| b == 0)
            .ok_or(malformed(what))?;
        let s = String::from_utf8_lossy(&strings[..nul]).into_owned();
        strings = &strings[nul + 1..];
        Ok::<_, NoteError>(s)
    };
    Ok(RawNote {
        pc: addr(0),
        base: addr(1),
        semaphore: addr(2),
        provider: next_string("stapsdt provider not NUL-terminated")?,
        name: next_string("stapsdt name not NUL-terminated")?,
        args: next_string("stapsdt arguments not NUL-terminated")?,
    })
}
