//! The file's bytes, read bounded: the ELF header, the `PT_LOAD` segments
//! and the two CFI sections, each read checked against the file's length
//! and charged to [`Limits::max_read`](super::Limits::max_read).

use std::fs::File;
use std::os::unix::fs::FileExt;

use object::LittleEndian as LE;
use object::elf;
use object::pod::{self, Pod};

use super::{ErrorKind, LoadSegment};

pub(super) enum Source<'a> {
    Bytes(&'a [u8]),
    File(&'a File),
}

/// Bounded positioned reads, each checked against the length and charged to
/// the budget.
pub(super) struct Reader_<'a> {
    source: Source<'a>,
    len: u64,
    budget: u64,
    limit: u64,
}

impl<'a> Reader_<'a> {
    pub(super) fn new(source: Source<'a>, len: u64, limit: u64) -> Self {
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

    pub(super) fn table<T: Pod + Copy>(
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

    pub(super) fn read_bytes(&self) -> u64 {
        self.limit - self.budget
    }
}

/// A CFI section: its address (for pc-relative encodings) and bytes.
pub(super) struct Section {
    pub(super) addr: u64,
    pub(super) data: Vec<u8>,
}

pub(super) fn unsupported(what: &'static str, value: impl Into<u64>) -> ErrorKind {
    ErrorKind::Unsupported {
        what,
        value: value.into(),
    }
}

pub(super) fn load_segments(
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
pub(super) fn cfi_sections(
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
