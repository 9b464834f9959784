//! Other formats, broken tables, overlapping and hostile notes, every
//! prefix and arbitrary bytes: refused cleanly, never a panic.

use proptest::prelude::*;

use super::*;

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
