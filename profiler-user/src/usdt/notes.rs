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

use std::fs::File;
use std::mem::size_of;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use object::LittleEndian as LE;
use object::elf;
use object::pod::{self, Pod};
use profiler_common::UsdtSpec;
use thiserror::Error;

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
pub const MAX_READ: u64 = 16 << 20;

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
pub fn probes_in_open_file(file: &File) -> Result<Vec<UsdtProbe>, NoteError> {
    let meta = file.metadata().map_err(NoteError::Read)?;
    if !meta.is_file() {
        return Err(NoteError::Read(std::io::Error::other("not a regular file")));
    }
    probes(&mut Reader::new(Source::File(file), meta.len()))
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
    probes(&mut Reader::new(Source::Bytes(data), data.len() as u64))
}

fn probes(data: &mut Reader<'_>) -> Result<Vec<UsdtProbe>, NoteError> {
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
            if name_is(&names, name, NOTE_SECTION) && sh.sh_type.get(LE) != elf::SHT_NOBITS {
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
    for area in &areas {
        let bytes = data.read(area.offset, area.size, "note area")?;
        walk_notes(&bytes, area.offset, area.align, &mut notes)?;
    }

    let loads = Loads::new(&segments);
    let file_len = data.len;
    Ok(notes
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
        .collect())
}

/// What the parser reads from: an image in memory or an open file.
enum Source<'a> {
    Bytes(&'a [u8]),
    File(&'a File),
}

/// Bounded, positioned reads of an ELF image: every read is checked against
/// the image's length and charged to a budget of [`MAX_READ`] bytes.
struct Reader<'a> {
    source: Source<'a>,
    len: u64,
    budget: u64,
}

impl<'a> Reader<'a> {
    fn new(source: Source<'a>, len: u64) -> Self {
        Reader {
            source,
            len,
            budget: MAX_READ,
        }
    }

    /// Bytes `offset..offset + len`, or `Truncated` / `TooLarge`.
    fn read(&mut self, offset: u64, len: u64, what: &'static str) -> Result<Vec<u8>, NoteError> {
        let truncated = |available: u64| NoteError::Truncated {
            what,
            offset,
            needed: len,
            available,
        };
        let available = self.len.saturating_sub(offset);
        let end = match offset.checked_add(len) {
            Some(end) if end <= self.len => end,
            _ => return Err(truncated(available)),
        };
        if len > self.budget {
            return Err(NoteError::TooLarge {
                what,
                offset,
                size: len,
                limit: MAX_READ,
            });
        }
        self.budget -= len;
        match self.source {
            // Both bounds are ≤ data.len(), so they fit in usize.
            Source::Bytes(data) => Ok(data[offset as usize..end as usize].to_vec()),
            Source::File(file) => {
                // ≤ MAX_READ, so it fits in usize.
                let mut buf = vec![0; len as usize];
                match file.read_exact_at(&mut buf, offset) {
                    Ok(()) => Ok(buf),
                    // The file shrank since we measured it.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        Err(truncated(available))
                    }
                    Err(e) => Err(NoteError::Read(e)),
                }
            }
        }
    }

    fn pod<T: Pod + Copy>(&mut self, offset: u64, what: &'static str) -> Result<T, NoteError> {
        let bytes = self.read(offset, size_of::<T>() as u64, what)?;
        // Cannot fail: the size was just checked and object's ELF structs have
        // alignment 1. Mapped anyway rather than unwrapped: this must not panic.
        pod::from_bytes::<T>(&bytes)
            .map(|(value, _)| *value)
            .map_err(|_| NoteError::Malformed { what, offset })
    }

    fn table<T: Pod + Copy>(
        &mut self,
        offset: u64,
        count: u64,
        what: &'static str,
    ) -> Result<Vec<T>, NoteError> {
        let len = count.saturating_mul(size_of::<T>() as u64);
        let bytes = self.read(offset, len, what)?;
        pod::slice_from_all_bytes::<T>(&bytes)
            .map(<[T]>::to_vec)
            .map_err(|_| NoteError::Malformed { what, offset })
    }
}

fn file_header(data: &mut Reader<'_>) -> Result<elf::FileHeader64<LE>, NoteError> {
    // The first bytes decide: a data file costs this one small read.
    let size = size_of::<elf::FileHeader64<LE>>() as u64;
    let head = data.read(0, data.len.min(size), "ELF header")?;
    if head.get(..elf::ELFMAG.len()) != Some(&elf::ELFMAG[..]) {
        return Err(NoteError::NotElf);
    }
    // e_ident[EI_CLASS], e_ident[EI_DATA]: checked before the rest of the
    // header so that a short 32-bit file reports its class, not truncation.
    let (Some(&class), Some(&encoding)) = (head.get(4), head.get(5)) else {
        return Err(NoteError::Truncated {
            what: "ELF identification",
            offset: 0,
            needed: 6,
            available: head.len() as u64,
        });
    };
    if class != elf::ELFCLASS64 {
        return Err(unsupported("class", class));
    }
    if encoding != elf::ELFDATA2LSB {
        return Err(unsupported("data encoding", encoding));
    }
    let header: elf::FileHeader64<LE> =
        pod::from_bytes(&head)
            .map(|(h, _)| *h)
            .map_err(|_| NoteError::Truncated {
                what: "ELF header",
                offset: 0,
                needed: size,
                available: head.len() as u64,
            })?;
    let machine = header.e_machine.get(LE);
    if machine != elf::EM_X86_64 {
        return Err(unsupported("machine", machine));
    }
    let kind = header.e_type.get(LE);
    if kind != elf::ET_EXEC && kind != elf::ET_DYN {
        return Err(unsupported("type", kind));
    }
    Ok(header)
}

fn unsupported(what: &'static str, value: impl Into<u64>) -> NoteError {
    NoteError::Unsupported {
        what,
        value: value.into(),
    }
}

/// The section header table; empty when the file has none.
fn section_headers(
    data: &mut Reader<'_>,
    header: &elf::FileHeader64<LE>,
) -> Result<Vec<elf::SectionHeader64<LE>>, NoteError> {
    let shoff = header.e_shoff.get(LE);
    if shoff == 0 {
        return Ok(Vec::new());
    }
    if usize::from(header.e_shentsize.get(LE)) != size_of::<elf::SectionHeader64<LE>>() {
        return Err(NoteError::Malformed {
            what: "section header entry size",
            offset: shoff,
        });
    }
    let count = match header.e_shnum.get(LE) {
        // Extended numbering: the real count is in section 0's sh_size.
        0 => data
            .pod::<elf::SectionHeader64<LE>>(shoff, "section header 0")?
            .sh_size
            .get(LE),
        n => u64::from(n),
    };
    data.table(shoff, count, "section header table")
}

/// The program header table; empty when the file has none.
fn program_headers(
    data: &mut Reader<'_>,
    header: &elf::FileHeader64<LE>,
    section_0: Option<&elf::SectionHeader64<LE>>,
) -> Result<Vec<elf::ProgramHeader64<LE>>, NoteError> {
    let phoff = header.e_phoff.get(LE);
    let count = match header.e_phnum.get(LE) {
        // Extended numbering: the real count is in section 0's sh_info.
        elf::PN_XNUM => match section_0 {
            Some(sh) => u64::from(sh.sh_info.get(LE)),
            None => {
                return Err(NoteError::Malformed {
                    what: "extended e_phnum without section 0",
                    offset: phoff,
                });
            }
        },
        n => u64::from(n),
    };
    if phoff == 0 || count == 0 {
        return Ok(Vec::new());
    }
    if usize::from(header.e_phentsize.get(LE)) != size_of::<elf::ProgramHeader64<LE>>() {
        return Err(NoteError::Malformed {
            what: "program header entry size",
            offset: phoff,
        });
    }
    data.table(phoff, count, "program header table")
}

/// The section name string table.
fn section_names(
    data: &mut Reader<'_>,
    header: &elf::FileHeader64<LE>,
    sections: &[elf::SectionHeader64<LE>],
) -> Result<Vec<u8>, NoteError> {
    let index = match header.e_shstrndx.get(LE) {
        // Extended numbering: the real index is in section 0's sh_link.
        elf::SHN_XINDEX => sections.first().map_or(0, |sh| sh.sh_link.get(LE)),
        n => u32::from(n),
    };
    let malformed = NoteError::Malformed {
        what: "section name table index",
        offset: header.e_shoff.get(LE),
    };
    if index == 0 {
        return Err(malformed);
    }
    let sh = usize::try_from(index)
        .ok()
        .and_then(|i| sections.get(i))
        .ok_or(malformed)?;
    if sh.sh_type.get(LE) == elf::SHT_NOBITS {
        return Ok(Vec::new());
    }
    data.read(
        sh.sh_offset.get(LE),
        sh.sh_size.get(LE),
        "section name table",
    )
}

/// Whether the NUL-terminated name at `offset` in `names` is `want`. Reads
/// at most `want.len() + 1` bytes, so scanning all sections stays linear.
fn name_is(names: &[u8], offset: u32, want: &[u8]) -> bool {
    usize::try_from(offset)
        .ok()
        .and_then(|start| names.get(start..))
        .is_some_and(|s| s.starts_with(want) && s.get(want.len()) == Some(&0))
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
/// `area_offset`) to `out`, skipping other notes.
fn walk_notes(
    area: &[u8],
    area_offset: u64,
    align: u64,
    out: &mut Vec<RawNote>,
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

/// The file-backed part of one PT_LOAD segment.
#[derive(Clone, Copy)]
struct Load {
    vaddr: u64,
    filesz: u64,
    offset: u64,
}

/// PT_LOAD segments sorted by address, for O(log n) lookups per probe.
struct Loads {
    code: Vec<Load>,
    all: Vec<Load>,
}

impl Loads {
    fn new(segments: &[elf::ProgramHeader64<LE>]) -> Self {
        let mut code = Vec::new();
        let mut all = Vec::new();
        for ph in segments
            .iter()
            .filter(|ph| ph.p_type.get(LE) == elf::PT_LOAD)
        {
            let load = Load {
                vaddr: ph.p_vaddr.get(LE),
                filesz: ph.p_filesz.get(LE),
                offset: ph.p_offset.get(LE),
            };
            if ph.p_flags.get(LE) & elf::PF_X != 0 {
                code.push(load);
            }
            all.push(load);
        }
        code.sort_by_key(|l| l.vaddr);
        all.sort_by_key(|l| l.vaddr);
        Self { code, all }
    }

    fn code_offset(&self, vaddr: u64, file_len: u64) -> Result<u64, LocateError> {
        match find(&self.code, vaddr) {
            Some(load) => {
                file_offset(load, vaddr, file_len).ok_or(LocateError::BeyondFile { vaddr })
            }
            None if find(&self.all, vaddr).is_some() => Err(LocateError::NotExecutable { vaddr }),
            None => Err(LocateError::NotMapped { vaddr }),
        }
    }

    fn data_offset(&self, vaddr: u64, file_len: u64) -> Option<u64> {
        find(&self.all, vaddr).and_then(|load| file_offset(load, vaddr, file_len))
    }
}

/// The segment containing `vaddr` in its file-backed part. PT_LOAD segments
/// are sorted and disjoint in valid files; with overlapping (hostile) ones
/// this may miss, which only makes the probe unattachable.
fn find(loads: &[Load], vaddr: u64) -> Option<&Load> {
    let after = loads.partition_point(|l| l.vaddr <= vaddr);
    let load = loads.get(after.checked_sub(1)?)?;
    (vaddr - load.vaddr < load.filesz).then_some(load)
}

fn file_offset(load: &Load, vaddr: u64, file_len: u64) -> Option<u64> {
    load.offset
        .checked_add(vaddr - load.vaddr)
        .filter(|&offset| offset < file_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Layout of the hand-built image (see `Image::build`).
    const CODE_VADDR: u64 = 0x10000; // file offset 0: headers, then nops at 0x100..0x200
    const DATA_OFFSET: u64 = 0x200;
    const DATA_VADDR: u64 = 0x20200; // 0x100 bytes; .stapsdt.base is its first byte
    const NOTES_OFFSET: u64 = 0x300;

    fn put(buf: &mut Vec<u8>, at: u64, bytes: &[u8]) {
        let at = at as usize;
        if buf.len() < at + bytes.len() {
            buf.resize(at + bytes.len(), 0);
        }
        buf[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// One raw note: header, name, descriptor, each padded to `align`.
    fn note(align: usize, owner: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let pad = |v: &mut Vec<u8>| v.resize(v.len().next_multiple_of(align), 0);
        let mut v = Vec::new();
        v.extend((owner.len() as u32 + 1).to_le_bytes());
        v.extend((desc.len() as u32).to_le_bytes());
        v.extend(kind.to_le_bytes());
        v.extend(owner);
        v.push(0);
        pad(&mut v);
        v.extend(desc);
        pad(&mut v);
        v
    }

    fn desc(pc: u64, base: u64, semaphore: u64, strings: [&str; 3]) -> Vec<u8> {
        let mut d = Vec::new();
        for a in [pc, base, semaphore] {
            d.extend(a.to_le_bytes());
        }
        for s in strings {
            d.extend(s.as_bytes());
            d.push(0);
        }
        d
    }

    fn probe_note(pc: u64, semaphore: u64, name: &str, args: &str) -> Vec<u8> {
        note(
            4,
            b"stapsdt",
            3,
            &desc(pc, DATA_VADDR, semaphore, ["prov", name, args]),
        )
    }

    /// A minimal x86_64 ET_DYN: an executable PT_LOAD of nops, a data
    /// PT_LOAD, a PT_NOTE over the notes and, optionally, section headers
    /// (`.note.stapsdt`, `.stapsdt.base`, `.shstrtab`).
    struct Image {
        notes: Vec<u8>,
        notes_offset: u64,
        note_align: u64,
        sections: bool,
    }

    impl Image {
        fn new(notes: Vec<u8>) -> Self {
            Self {
                notes,
                notes_offset: NOTES_OFFSET,
                note_align: 4,
                sections: true,
            }
        }

        fn build(&self) -> Vec<u8> {
            let mut f = vec![0u8; 0x300];
            let notes_len = self.notes.len() as u64;
            put(&mut f, self.notes_offset, &self.notes);
            // Headers.
            put(&mut f, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
            put(&mut f, 16, &elf::ET_DYN.to_le_bytes());
            put(&mut f, 18, &elf::EM_X86_64.to_le_bytes());
            put(&mut f, 20, &1u32.to_le_bytes());
            put(&mut f, 32, &64u64.to_le_bytes()); // e_phoff
            put(&mut f, 52, &64u16.to_le_bytes()); // e_ehsize
            put(&mut f, 54, &56u16.to_le_bytes()); // e_phentsize
            put(&mut f, 56, &3u16.to_le_bytes()); // e_phnum
            let phdr = |f: &mut Vec<u8>,
                        i: u64,
                        kind: u32,
                        flags: u32,
                        offset: u64,
                        vaddr: u64,
                        size: u64,
                        align: u64| {
                let at = 64 + 56 * i;
                put(f, at, &kind.to_le_bytes());
                put(f, at + 4, &flags.to_le_bytes());
                for (j, v) in [offset, vaddr, vaddr, size, size, align]
                    .into_iter()
                    .enumerate()
                {
                    put(f, at + 8 + 8 * j as u64, &v.to_le_bytes());
                }
            };
            phdr(
                &mut f,
                0,
                elf::PT_LOAD,
                elf::PF_R | elf::PF_X,
                0,
                CODE_VADDR,
                0x200,
                0x1000,
            );
            phdr(
                &mut f,
                1,
                elf::PT_LOAD,
                elf::PF_R | elf::PF_W,
                DATA_OFFSET,
                DATA_VADDR,
                0x100,
                0x1000,
            );
            phdr(
                &mut f,
                2,
                elf::PT_NOTE,
                elf::PF_R,
                self.notes_offset,
                0,
                notes_len,
                self.note_align,
            );
            f[0x100..0x200].fill(0x90);
            if self.sections {
                let strtab_offset = (f.len() as u64).next_multiple_of(8);
                let strtab = b"\0.note.stapsdt\0.stapsdt.base\0.shstrtab\0";
                put(&mut f, strtab_offset, strtab);
                let shoff = (f.len() as u64).next_multiple_of(8);
                put(&mut f, 40, &shoff.to_le_bytes());
                put(&mut f, 58, &64u16.to_le_bytes()); // e_shentsize
                put(&mut f, 60, &4u16.to_le_bytes()); // e_shnum
                put(&mut f, 62, &3u16.to_le_bytes()); // e_shstrndx
                let shdr = |f: &mut Vec<u8>,
                            i: u64,
                            name: u32,
                            kind: u32,
                            addr: u64,
                            offset: u64,
                            size: u64,
                            align: u64| {
                    let at = shoff + 64 * i;
                    put(f, at, &name.to_le_bytes());
                    put(f, at + 4, &kind.to_le_bytes());
                    put(f, at + 16, &addr.to_le_bytes());
                    put(f, at + 24, &offset.to_le_bytes());
                    put(f, at + 32, &size.to_le_bytes());
                    put(f, at + 48, &align.to_le_bytes());
                };
                shdr(&mut f, 0, 0, 0, 0, 0, 0, 0);
                shdr(
                    &mut f,
                    1,
                    1,
                    elf::SHT_NOTE,
                    0,
                    self.notes_offset,
                    notes_len,
                    self.note_align,
                );
                shdr(
                    &mut f,
                    2,
                    15,
                    elf::SHT_PROGBITS,
                    DATA_VADDR,
                    DATA_OFFSET,
                    1,
                    1,
                );
                shdr(
                    &mut f,
                    3,
                    29,
                    elf::SHT_STRTAB,
                    0,
                    strtab_offset,
                    strtab.len() as u64,
                    1,
                );
                f.resize(shoff as usize + 4 * 64, 0);
            }
            f
        }
    }

    fn two_probes() -> Vec<u8> {
        let mut notes = note(4, b"GNU", 3, &[1, 2, 3, 4, 5]);
        notes.extend(probe_note(CODE_VADDR + 0x110, 0, "alloc", "8@%rdi -8@%rsi"));
        notes.extend(probe_note(
            CODE_VADDR + 0x123,
            DATA_VADDR + 0x10,
            "free",
            "",
        ));
        notes
    }

    fn check_two_probes(probes: &[UsdtProbe]) {
        assert_eq!(probes.len(), 2, "{probes:#?}");
        let (a, f) = (&probes[0], &probes[1]);
        assert_eq!(
            (a.provider.as_str(), a.name.as_str(), a.args.as_str()),
            ("prov", "alloc", "8@%rdi -8@%rsi")
        );
        assert_eq!(
            (a.pc, a.file_offset, a.semaphore, a.semaphore_offset),
            (CODE_VADDR + 0x110, Ok(0x110), 0, None)
        );
        assert_eq!(a.spec().unwrap().arg_count, 2);
        assert_eq!((f.name.as_str(), f.args.as_str()), ("free", ""));
        assert_eq!(f.file_offset, Ok(0x123));
        assert_eq!(
            (f.semaphore, f.semaphore_offset),
            (DATA_VADDR + 0x10, Some(DATA_OFFSET + 0x10))
        );
    }

    #[test]
    fn probes_through_section_headers() {
        check_two_probes(&probes_in_elf(&Image::new(two_probes()).build()).unwrap());
    }

    #[test]
    fn probes_through_pt_note_without_section_headers() {
        let image = Image {
            sections: false,
            ..Image::new(two_probes())
        };
        check_two_probes(&probes_in_elf(&image.build()).unwrap());
    }

    #[test]
    fn eight_byte_aligned_and_oddly_placed_notes() {
        let mut notes = note(8, b"GNU", 5, &[1, 2, 3, 4, 5]);
        notes.extend(note(
            8,
            b"stapsdt",
            3,
            &desc(CODE_VADDR + 0x110, DATA_VADDR, 0, ["p", "n", "$1"]),
        ));
        let image = Image {
            note_align: 8,
            ..Image::new(notes)
        };
        let probes = probes_in_elf(&image.build()).unwrap();
        assert_eq!((probes.len(), probes[0].file_offset), (1, Ok(0x110)));
        // Alignment is relative to the note area, wherever that starts.
        for notes_offset in [0x301, 0x302, 0x303] {
            let image = Image {
                notes_offset,
                ..Image::new(two_probes())
            };
            check_two_probes(&probes_in_elf(&image.build()).unwrap());
        }
    }

    #[test]
    fn stapsdt_base_adjusts_for_prelink() {
        // Prelink moved the image by 0x1000 after the notes were written: the
        // notes hold the old pc, semaphore and .stapsdt.base address.
        let old = |a: u64| a - 0x1000;
        let d = desc(
            old(CODE_VADDR + 0x110),
            old(DATA_VADDR),
            old(DATA_VADDR + 8),
            ["p", "n", ""],
        );
        let probes = probes_in_elf(&Image::new(note(4, b"stapsdt", 3, &d)).build()).unwrap();
        assert_eq!(probes[0].pc, CODE_VADDR + 0x110);
        assert_eq!(probes[0].file_offset, Ok(0x110));
        assert_eq!(probes[0].semaphore, DATA_VADDR + 8);
        assert_eq!(probes[0].semaphore_offset, Some(DATA_OFFSET + 8));
        // Without section headers there is no .stapsdt.base to adjust by.
        let image = Image {
            sections: false,
            ..Image::new(note(4, b"stapsdt", 3, &d))
        };
        assert_eq!(
            probes_in_elf(&image.build()).unwrap()[0].pc,
            old(CODE_VADDR + 0x110)
        );
    }

    #[test]
    fn unlocatable_probes_are_reported_per_probe() {
        let mut notes = probe_note(DATA_VADDR + 4, 0, "in_data", "");
        notes.extend(probe_note(0x99999, 0x99999, "unmapped", ""));
        notes.extend(probe_note(u64::MAX, u64::MAX, "wraps", ""));
        notes.extend(probe_note(CODE_VADDR + 0x1ff, 0, "last_byte", ""));
        notes.extend(probe_note(CODE_VADDR + 0x200, 0, "one_past", ""));
        let probes = probes_in_elf(&Image::new(notes).build()).unwrap();
        let offsets: Vec<_> = probes
            .iter()
            .map(|p| (p.name.as_str(), p.file_offset, p.semaphore_offset))
            .collect();
        assert_eq!(
            offsets,
            [
                (
                    "in_data",
                    Err(LocateError::NotExecutable {
                        vaddr: DATA_VADDR + 4
                    }),
                    None
                ),
                (
                    "unmapped",
                    Err(LocateError::NotMapped { vaddr: 0x99999 }),
                    None
                ),
                (
                    "wraps",
                    Err(LocateError::NotMapped { vaddr: u64::MAX }),
                    None
                ),
                ("last_byte", Ok(0x1ff), None),
                (
                    "one_past",
                    Err(LocateError::NotMapped {
                        vaddr: CODE_VADDR + 0x200
                    }),
                    None
                ),
            ]
        );
    }

    #[test]
    fn no_probes_is_empty() {
        assert_eq!(probes_in_elf(&Image::new(Vec::new()).build()).unwrap(), []);
        let other = note(4, b"GNU", 3, &[0; 20]);
        assert_eq!(
            probes_in_elf(&Image::new(other.clone()).build()).unwrap(),
            []
        );
        // Right owner, wrong type; right type, owner only a prefix.
        let mut notes = note(4, b"stapsdt", 1, &desc(0, 0, 0, ["p", "n", ""]));
        notes.extend(note(4, b"stapsdtx", 3, &desc(0, 0, 0, ["p", "n", ""])));
        assert_eq!(probes_in_elf(&Image::new(notes).build()).unwrap(), []);
        let image = Image {
            sections: false,
            ..Image::new(other)
        };
        assert_eq!(probes_in_elf(&image.build()).unwrap(), []);
    }

    fn err(data: &[u8]) -> NoteError {
        probes_in_elf(data).expect_err("should be rejected")
    }

    #[test]
    fn rejects_other_formats() {
        assert!(matches!(err(b""), NoteError::NotElf));
        assert!(matches!(err(b"\x7fEL"), NoteError::NotElf));
        assert!(matches!(err(b"#!/bin/sh\n"), NoteError::NotElf));
        assert!(matches!(err(b"\x7fELF"), NoteError::Truncated { .. }));
        let valid = Image::new(two_probes()).build();
        let patched = |at: usize, bytes: &[u8]| {
            let mut f = valid.clone();
            f[at..at + bytes.len()].copy_from_slice(bytes);
            f
        };
        let unsupported = |f: &[u8]| match err(f) {
            NoteError::Unsupported { what, value } => (what, value),
            e => panic!("{e:?}"),
        };
        assert_eq!(unsupported(&patched(4, &[1])), ("class", 1));
        assert_eq!(unsupported(&patched(4, &[1])[..6]), ("class", 1));
        assert_eq!(unsupported(&patched(5, &[2])), ("data encoding", 2));
        assert_eq!(
            unsupported(&patched(18, &elf::EM_AARCH64.to_le_bytes())),
            ("machine", 183)
        );
        assert_eq!(
            unsupported(&patched(16, &elf::ET_REL.to_le_bytes())),
            ("type", 1)
        );
        assert_eq!(
            unsupported(&patched(16, &elf::ET_CORE.to_le_bytes())),
            ("type", 4)
        );
        assert!(matches!(
            err(&valid[..63]),
            NoteError::Truncated {
                what: "ELF header",
                ..
            }
        ));
    }

    #[test]
    fn rejects_broken_tables() {
        let valid = Image::new(two_probes()).build();
        let shoff = u64::from_le_bytes(valid[40..48].try_into().unwrap()) as usize;
        let patched = |at: usize, bytes: &[u8]| {
            let mut f = valid.clone();
            f[at..at + bytes.len()].copy_from_slice(bytes);
            f
        };
        let e = err(&valid[..valid.len() - 1]);
        assert!(
            matches!(
                e,
                NoteError::Truncated {
                    what: "section header table",
                    ..
                }
            ),
            "{e}"
        );
        let e = err(&patched(40, &u64::MAX.to_le_bytes()));
        assert!(
            matches!(
                e,
                NoteError::Truncated {
                    what: "section header 0" | "section header table",
                    ..
                }
            ),
            "{e}"
        );
        let e = err(&patched(58, &63u16.to_le_bytes()));
        assert!(
            matches!(
                e,
                NoteError::Malformed {
                    what: "section header entry size",
                    ..
                }
            ),
            "{e}"
        );
        let e = err(&patched(54, &55u16.to_le_bytes()));
        assert!(
            matches!(
                e,
                NoteError::Malformed {
                    what: "program header entry size",
                    ..
                }
            ),
            "{e}"
        );
        let e = err(&patched(56, &0xfff0u16.to_le_bytes()));
        assert!(
            matches!(
                e,
                NoteError::Truncated {
                    what: "program header table",
                    ..
                }
            ),
            "{e}"
        );
        // Extended e_phnum, with section 0's sh_info saying 3: still fine.
        let mut f = patched(56, &elf::PN_XNUM.to_le_bytes());
        f[shoff + 44..shoff + 48].copy_from_slice(&3u32.to_le_bytes());
        check_two_probes(&probes_in_elf(&f).unwrap());
        // Extended e_shnum (0, real count in sh_size) and e_shstrndx (sh_link).
        let mut f = patched(60, &0u16.to_le_bytes());
        f[62..64].copy_from_slice(&elf::SHN_XINDEX.to_le_bytes());
        f[shoff + 32..shoff + 40].copy_from_slice(&4u64.to_le_bytes());
        f[shoff + 40..shoff + 44].copy_from_slice(&3u32.to_le_bytes());
        check_two_probes(&probes_in_elf(&f).unwrap());
        f[shoff + 32..shoff + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(err(&f), NoteError::Truncated { .. }));
        for index in [0u16, 4, 0xfeff] {
            let e = err(&patched(62, &index.to_le_bytes()));
            assert!(
                matches!(
                    e,
                    NoteError::Malformed {
                        what: "section name table index",
                        ..
                    }
                ),
                "{e}"
            );
        }
        // The note section pointing past the end of the file.
        let e = err(&patched(shoff + 64 + 32, &u64::MAX.to_le_bytes()));
        assert!(
            matches!(
                e,
                NoteError::Truncated {
                    what: "note area",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn rejects_overlapping_note_areas() {
        let mut f = Image {
            sections: false,
            ..Image::new(two_probes())
        }
        .build();
        // Turn the data PT_LOAD into a second PT_NOTE over the same notes,
        // repeated: 65535 of them would otherwise cost 65535 passes.
        let (note_ph, data_ph) = (64 + 2 * 56, 64 + 56);
        let copy: Vec<u8> = f[note_ph..note_ph + 56].to_vec();
        f[data_ph..data_ph + 56].copy_from_slice(&copy);
        let e = err(&f);
        assert!(
            matches!(
                e,
                NoteError::Malformed {
                    what: "note sections or segments overlap",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn rejects_hostile_notes() {
        let good = desc(CODE_VADDR + 0x110, DATA_VADDR, 0, ["p", "n", "8@%rdi"]);
        let header = |namesz: u32, descsz: u32| {
            let mut v = Vec::new();
            for w in [namesz, descsz, 3] {
                v.extend(w.to_le_bytes());
            }
            v.extend(b"stapsdt\0");
            v
        };
        let with_desc = |d: &[u8]| {
            let mut v = header(8, d.len() as u32);
            v.extend(d);
            v
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("namesz huge", header(u32::MAX, 40), "note"),
            ("descsz huge", header(8, u32::MAX), "note"),
            (
                "descsz one past",
                with_desc(&good)[..good.len() + 19].to_vec(),
                "note",
            ),
            ("header cut", header(8, 0)[..11].to_vec(), "note header"),
            (
                "trailing bytes",
                [note(4, b"GNU", 1, &[]), vec![0; 8]].concat(),
                "note header",
            ),
            (
                "desc too short",
                with_desc(&good[..23]),
                "stapsdt descriptor shorter than its three addresses",
            ),
            (
                "no provider NUL",
                with_desc(&good[..25]),
                "stapsdt provider not NUL-terminated",
            ),
            (
                "no name NUL",
                with_desc(&good[..27]),
                "stapsdt name not NUL-terminated",
            ),
            (
                "no args NUL",
                with_desc(&good[..good.len() - 1]),
                "stapsdt arguments not NUL-terminated",
            ),
            (
                "empty desc",
                with_desc(&[]),
                "stapsdt descriptor shorter than its three addresses",
            ),
        ];
        for (label, notes, want) in cases {
            for sections in [true, false] {
                let image = Image {
                    sections,
                    ..Image::new(notes.clone())
                };
                let got = match err(&image.build()) {
                    NoteError::Truncated { what, .. } | NoteError::Malformed { what, .. } => what,
                    e => panic!("{label}: {e:?}"),
                };
                assert_eq!(got, want, "{label}");
            }
        }
        // Non-UTF-8 strings are decoded lossily rather than rejected.
        let d = desc(CODE_VADDR + 0x110, DATA_VADDR, 0, ["p", "n", ""]);
        let mut d = d;
        d[24] = 0xff;
        let probes = probes_in_elf(&Image::new(note(4, b"stapsdt", 3, &d)).build()).unwrap();
        assert_eq!(probes[0].provider, "\u{fffd}");
    }

    #[test]
    fn every_prefix_fails_cleanly() {
        let valid = Image::new(two_probes()).build();
        for len in 0..valid.len() {
            assert!(probes_in_elf(&valid[..len]).is_err(), "prefix {len}");
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..2048)) {
            let _ = probes_in_elf(&data);
        }

        #[test]
        fn never_panics_on_elf_header_then_garbage(tail in prop::collection::vec(any::<u8>(), 0..2048)) {
            let mut data = Image::new(Vec::new()).build()[..64].to_vec();
            data.extend(tail);
            let _ = probes_in_elf(&data);
        }

        #[test]
        fn never_panics_on_mutated_images(
            sections in any::<bool>(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
            wide in prop::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 0..3),
            cut in any::<prop::sample::Index>(),
            do_cut in any::<bool>(),
        ) {
            let mut data = Image { sections, ..Image::new(two_probes()) }.build();
            for (at, byte) in edits {
                let i = at.index(data.len());
                data[i] = byte;
            }
            // Whole words too: single bytes rarely make a size huge.
            for (at, word) in wide {
                let i = at.index(data.len() - 8);
                data[i..i + 8].copy_from_slice(&word.to_le_bytes());
            }
            if do_cut {
                data.truncate(cut.index(data.len()));
            }
            if let Ok(probes) = probes_in_elf(&data) {
                for p in probes {
                    if let Ok(offset) = p.file_offset {
                        prop_assert!(offset < data.len() as u64);
                    }
                    let _ = p.spec();
                }
            }
        }
    }

    /// A real sparse file of `len` bytes starting with `head`.
    fn sparse_file(name: &str, head: &[u8], len: u64) -> (PathBuf, File) {
        let path = std::env::temp_dir().join(format!("allocprof-{name}-{}", std::process::id()));
        std::fs::write(&path, head).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len).unwrap();
        (path.clone(), File::open(&path).unwrap())
    }

    #[test]
    fn a_large_data_file_costs_one_small_read() {
        let (path, file) = sparse_file("data", b"just data", 4 << 30);
        let err = probes_in_open_file(&file).unwrap_err();
        std::fs::remove_file(path).unwrap();
        assert!(matches!(err, NoteError::NotElf), "{err}");
    }

    #[test]
    fn absurd_section_sizes_are_refused_before_reading() {
        // A valid image whose .note.stapsdt claims 3 GiB, in a 4 GiB sparse
        // file: reading it whole is what a hostile target would want.
        let mut image = Image::new(two_probes()).build();
        let mut reader = Reader::new(Source::Bytes(&image), image.len() as u64);
        let header = file_header(&mut reader).unwrap();
        let sections = section_headers(&mut reader, &header).unwrap();
        let names = section_names(&mut reader, &header, &sections).unwrap();
        let index = sections
            .iter()
            .position(|sh| name_is(&names, sh.sh_name.get(LE), NOTE_SECTION))
            .unwrap();
        let sh_size = header.e_shoff.get(LE) as usize + index * 64 + 32;
        image[sh_size..sh_size + 8].copy_from_slice(&(3u64 << 30).to_le_bytes());
        let (path, file) = sparse_file("elf", &image, 4 << 30);
        let err = probes_in_open_file(&file).unwrap_err();
        std::fs::remove_file(path).unwrap();
        assert!(
            matches!(
                err,
                NoteError::TooLarge {
                    what: "note area",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn files_parse_like_images() {
        let image = Image::new(two_probes()).build();
        let (path, file) = sparse_file("probes", &image, image.len() as u64);
        let probes = probes_in_open_file(&file).unwrap();
        std::fs::remove_file(path).unwrap();
        check_two_probes(&probes);
    }
}
