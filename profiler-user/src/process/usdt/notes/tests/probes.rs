//! What is found: probes through section headers or PT_NOTE, at any
//! alignment, prelinked, unlocatable; the backend statistics note.

use super::*;

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
