//! Hand-built images (`Image`) and notes, shared by the tests: what is
//! found (`probes.rs`), what is refused, hostile or broken (`hostile.rs`),
//! and real files (`files.rs`).

mod files;
mod hostile;
mod probes;

use super::*;

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
