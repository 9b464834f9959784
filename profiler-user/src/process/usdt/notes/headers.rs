//! ELF parsing for the note reader: the file header, the section and
//! program header tables, section names, and PT_LOAD lookups that turn a
//! probe address into a file offset.

use std::mem::size_of;

use object::LittleEndian as LE;
use object::elf;
use object::pod;

use super::reader::Reader;
use super::{LocateError, NoteError};

pub(super) fn file_header(data: &mut Reader<'_>) -> Result<elf::FileHeader64<LE>, NoteError> {
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

pub(super) fn unsupported(what: &'static str, value: impl Into<u64>) -> NoteError {
    NoteError::Unsupported {
        what,
        value: value.into(),
    }
}

/// The section header table; empty when the file has none.
pub(super) fn section_headers(
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
pub(super) fn program_headers(
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
pub(super) fn section_names(
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
pub(super) fn name_is(names: &[u8], offset: u32, want: &[u8]) -> bool {
    usize::try_from(offset)
        .ok()
        .and_then(|start| names.get(start..))
        .is_some_and(|s| s.starts_with(want) && s.get(want.len()) == Some(&0))
}

/// The file-backed part of one PT_LOAD segment.
#[derive(Clone, Copy)]
pub(super) struct Load {
    vaddr: u64,
    filesz: u64,
    offset: u64,
}

/// PT_LOAD segments sorted by address, for O(log n) lookups per probe.
pub(super) struct Loads {
    code: Vec<Load>,
    all: Vec<Load>,
}

impl Loads {
    pub(super) fn new(segments: &[elf::ProgramHeader64<LE>]) -> Self {
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

    pub(super) fn code_offset(&self, vaddr: u64, file_len: u64) -> Result<u64, LocateError> {
        match find(&self.code, vaddr) {
            Some(load) => {
                file_offset(load, vaddr, file_len).ok_or(LocateError::BeyondFile { vaddr })
            }
            None if find(&self.all, vaddr).is_some() => Err(LocateError::NotExecutable { vaddr }),
            None => Err(LocateError::NotMapped { vaddr }),
        }
    }

    pub(super) fn data_offset(&self, vaddr: u64, file_len: u64) -> Option<u64> {
        find(&self.all, vaddr).and_then(|load| file_offset(load, vaddr, file_len))
    }
}

/// The segment containing `vaddr` in its file-backed part. PT_LOAD segments
/// are sorted and disjoint in valid files; with overlapping (hostile) ones
/// this may miss, which only makes the probe unattachable.
pub(super) fn find(loads: &[Load], vaddr: u64) -> Option<&Load> {
    let after = loads.partition_point(|l| l.vaddr <= vaddr);
    let load = loads.get(after.checked_sub(1)?)?;
    (vaddr - load.vaddr < load.filesz).then_some(load)
}

pub(super) fn file_offset(load: &Load, vaddr: u64, file_len: u64) -> Option<u64> {
    load.offset
        .checked_add(vaddr - load.vaddr)
        .filter(|&offset| offset < file_len)
}
