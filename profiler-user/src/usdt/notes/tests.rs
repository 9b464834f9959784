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

#[test]
fn the_backend_stats_note_gives_the_blocks_file_offset() {
    let stats = |desc: &[u8]| note(4, b"allocprof", 1, desc);
    let block = DATA_VADDR + 0x10;
    for sections in [true, false] {
        let mut notes = probe_note(CODE_VADDR + 0x10, 0, "alloc", "8@%rdi");
        notes.extend(stats(&block.to_le_bytes()));
        let mut image = Image::new(notes);
        image.sections = sections;
        let found = notes_in_elf(&image.build()).unwrap();
        assert_eq!(found.probes.len(), 1);
        assert_eq!(found.backend_stats, Some(DATA_OFFSET + 0x10));
    }
    // A descriptor of another length, another owner or type, or an
    // address in no file-backed segment: no block.
    for notes in [
        stats(&[0; 12]),
        note(4, b"allocprox", 1, &block.to_le_bytes()),
        note(4, b"allocprof", 2, &block.to_le_bytes()),
        stats(&0xdead_0000u64.to_le_bytes()),
    ] {
        let found = notes_in_elf(&Image::new(notes).build()).unwrap();
        assert_eq!(found.backend_stats, None);
    }
}
