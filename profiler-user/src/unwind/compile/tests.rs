use gimli::write::{
    Address, CallFrameInstruction as I, CommonInformationEntry, EhFrame as EhFrameW, EndianVec,
    Expression, FrameDescriptionEntry, FrameTable,
};
use gimli::{Encoding, Format, LittleEndian, Register, X86_64};
use object::pod::{self, Pod};
use profiler_common::unwind::{cfa, rbp};
use proptest::prelude::*;

use super::*;

const TEXT: u64 = 0x1000;

/// The standard x86-64 CIE: CFA = rsp + 8, RA at CFA − 8.
fn cie() -> CommonInformationEntry {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, X86_64::RA);
    cie.add_instruction(I::Cfa(X86_64::RSP, 8));
    cie.add_instruction(I::Offset(X86_64::RA, -8));
    cie
}

/// `.eh_frame` with FDEs (start, len, [(offset, instruction)]) under `cie`.
/// An FDE: start, length, instructions at offsets.
type TestFde = (u64, u32, Vec<(u32, I)>);

fn eh_frame(cie: CommonInformationEntry, fdes: Vec<TestFde>) -> Vec<u8> {
    let mut table = FrameTable::default();
    let id = table.add_cie(cie);
    for (start, len, instructions) in fdes {
        let mut fde = FrameDescriptionEntry::new(Address::Constant(start), len);
        for (at, i) in instructions {
            fde.add_instruction(at, i);
        }
        table.add_fde(id, fde);
    }
    let mut out = EhFrameW(EndianVec::new(LittleEndian));
    table.write_eh_frame(&mut out).unwrap();
    out.0.into_vec()
}

/// A minimal x86-64 ELF: one executable PT_LOAD at vaddr 0 (file offset 0)
/// of 1 MiB, sections `.eh_frame` (at vaddr = file offset) and `.shstrtab`.
fn elf(sections: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; 64 + 56];
    let mut names = vec![0u8];
    let mut headers = vec![zeroed::<elf::SectionHeader64<LE>>()];
    for (name, data) in sections {
        let mut h = zeroed::<elf::SectionHeader64<LE>>();
        h.sh_name.set(LE, names.len() as u32);
        names.extend_from_slice(name.as_bytes());
        names.push(0);
        h.sh_type.set(LE, elf::SHT_PROGBITS);
        h.sh_offset.set(LE, out.len() as u64);
        h.sh_addr.set(LE, out.len() as u64);
        h.sh_size.set(LE, data.len() as u64);
        out.extend_from_slice(data);
        headers.push(h);
    }
    let mut h = zeroed::<elf::SectionHeader64<LE>>();
    h.sh_name.set(LE, names.len() as u32);
    names.extend_from_slice(b".shstrtab\0");
    h.sh_type.set(LE, elf::SHT_STRTAB);
    h.sh_offset.set(LE, out.len() as u64);
    h.sh_size.set(LE, names.len() as u64);
    out.extend_from_slice(&names);
    headers.push(h);
    let shoff = out.len() as u64;
    for h in &headers {
        out.extend_from_slice(pod::bytes_of(h));
    }
    let mut fh = zeroed::<elf::FileHeader64<LE>>();
    fh.e_ident.magic = elf::ELFMAG;
    fh.e_ident.class = elf::ELFCLASS64;
    fh.e_ident.data = elf::ELFDATA2LSB;
    fh.e_ident.version = elf::EV_CURRENT;
    fh.e_type.set(LE, elf::ET_DYN);
    fh.e_machine.set(LE, elf::EM_X86_64);
    fh.e_phoff.set(LE, 64);
    fh.e_phentsize.set(LE, 56);
    fh.e_phnum.set(LE, 1);
    fh.e_shoff.set(LE, shoff);
    fh.e_shentsize.set(LE, 64);
    fh.e_shnum.set(LE, headers.len() as u16);
    fh.e_shstrndx.set(LE, headers.len() as u16 - 1);
    out[..64].copy_from_slice(pod::bytes_of(&fh));
    let mut ph = zeroed::<elf::ProgramHeader64<LE>>();
    ph.p_type.set(LE, elf::PT_LOAD);
    ph.p_flags.set(LE, elf::PF_R | elf::PF_X);
    ph.p_filesz.set(LE, 1 << 20);
    ph.p_memsz.set(LE, 1 << 20);
    out[64..120].copy_from_slice(pod::bytes_of(&ph));
    out
}

fn compile_ok(data: &[u8]) -> UnwindTable {
    compile_elf(data, Path::new("test.so"), &Limits::default()).unwrap()
}

fn r(pc: u64, cfa_rule: u8, cfa_offset: i32, rbp_rule: u8, rbp_offset: i16) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_offset,
        rbp_offset,
        cfa_rule,
        rbp_rule,
    }
}

#[test]
fn a_typical_function_without_frame_pointers() {
    // push %rbx; sub $16,%rsp; ...; add; pop; ret
    let eh = eh_frame(
        cie(),
        vec![(
            TEXT,
            0x40,
            vec![
                (1, I::CfaOffset(16)),
                (5, I::CfaOffset(32)),
                (0x30, I::CfaOffset(16)),
                (0x31, I::CfaOffset(8)),
            ],
        )],
    );
    let table = compile_ok(&elf(&[(".eh_frame", &eh)]));
    assert_eq!(
        table.rows,
        [
            r(TEXT, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 1, cfa::RSP, 16, rbp::SAME, 0),
            r(TEXT + 5, cfa::RSP, 32, rbp::SAME, 0),
            r(TEXT + 0x30, cfa::RSP, 16, rbp::SAME, 0),
            r(TEXT + 0x31, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x40, cfa::UNKNOWN, 0, rbp::SAME, 0),
        ]
    );
    assert_eq!(table.stats.fdes, 1);
    assert_eq!(table.stats.rows, 6);
    assert_eq!(table.stats.skipped_fdes, 0);
}

#[test]
fn frame_pointer_functions_save_rbp_at_the_cfa() {
    // push %rbp; mov %rsp,%rbp; ...; leave; ret
    let eh = eh_frame(
        cie(),
        vec![(
            TEXT,
            0x20,
            vec![
                (1, I::CfaOffset(16)),
                (1, I::Offset(X86_64::RBP, -16)),
                (4, I::CfaRegister(X86_64::RBP)),
                (0x1f, I::Cfa(X86_64::RSP, 8)),
            ],
        )],
    );
    let table = compile_ok(&elf(&[(".eh_frame", &eh)]));
    assert_eq!(
        table.rows,
        [
            r(TEXT, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 1, cfa::RSP, 16, rbp::AT_CFA, -16),
            r(TEXT + 4, cfa::RBP, 16, rbp::AT_CFA, -16),
            r(TEXT + 0x1f, cfa::RSP, 8, rbp::AT_CFA, -16),
            r(TEXT + 0x20, cfa::UNKNOWN, 0, rbp::SAME, 0),
        ]
    );
}

#[test]
fn plt_expressions_outermost_frames_and_other_rules() {
    let plt = vec![0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
    let mut other = plt.clone();
    other[6] = 0x3a; // lit10: not the PLT form the kernel applies.
    let eh = eh_frame(
        cie(),
        vec![
            (
                TEXT,
                0x10,
                vec![(0, I::CfaExpression(Expression::raw(plt)))],
            ),
            (
                TEXT + 0x10,
                0x10,
                vec![(0, I::CfaExpression(Expression::raw(other)))],
            ),
            (TEXT + 0x20, 0x10, vec![(4, I::Undefined(X86_64::RA))]),
            (TEXT + 0x30, 0x10, vec![(0, I::Cfa(X86_64::RBX, 8))]),
            (
                TEXT + 0x40,
                0x10,
                vec![(0, I::Register(X86_64::RBP, X86_64::RBX))],
            ),
            (TEXT + 0x50, 0x10, vec![(0, I::Offset(X86_64::RA, -16))]),
            (
                TEXT + 0x60,
                0x10,
                vec![(0, I::Offset(X86_64::RBP, -8 * 8192))],
            ),
        ],
    );
    let table = compile_ok(&elf(&[(".eh_frame", &eh)]));
    assert_eq!(
        table.rows,
        [
            r(TEXT, cfa::PLT, 8, rbp::SAME, 0),
            r(TEXT + 0x10, cfa::UNKNOWN, 0, rbp::SAME, 0),
            r(TEXT + 0x20, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x24, cfa::END, 0, rbp::SAME, 0),
            r(TEXT + 0x30, cfa::UNKNOWN, 0, rbp::SAME, 0),
        ]
    );
}

#[test]
fn signal_trampolines_are_unknown() {
    let mut c = cie();
    c.signal_trampoline = true;
    let eh = eh_frame(c, vec![(TEXT, 0x10, vec![])]);
    let table = compile_ok(&elf(&[(".eh_frame", &eh)]));
    assert_eq!(table.rows, [r(TEXT, cfa::UNKNOWN, 0, rbp::SAME, 0)]);
}

#[test]
fn gaps_overlaps_and_stale_fdes() {
    let eh = eh_frame(
        cie(),
        vec![
            // Out of order, with a gap between 0x1010 and 0x1020.
            (TEXT + 0x20, 0x10, vec![(1, I::CfaOffset(16))]),
            (TEXT, 0x10, vec![]),
            // Adjacent to the first: no UNKNOWN row between them.
            (TEXT + 0x30, 0x10, vec![]),
            // Nested in a wider one: the narrower wins from its start.
            (TEXT + 0x100, 0x40, vec![(0, I::CfaOffset(24))]),
            (TEXT + 0x110, 0x10, vec![]),
            // Same start, narrower wins.
            (TEXT + 0x200, 0x20, vec![(0, I::CfaOffset(24))]),
            (TEXT + 0x200, 0x10, vec![]),
            // Outside the executable segment (a discarded section's FDE).
            (2 << 20, 0x10, vec![]),
        ],
    );
    let table = compile_ok(&elf(&[(".eh_frame", &eh)]));
    assert_eq!(
        table.rows,
        [
            r(TEXT, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x10, cfa::UNKNOWN, 0, rbp::SAME, 0),
            r(TEXT + 0x20, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x21, cfa::RSP, 16, rbp::SAME, 0),
            r(TEXT + 0x30, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x40, cfa::UNKNOWN, 0, rbp::SAME, 0),
            r(TEXT + 0x100, cfa::RSP, 24, rbp::SAME, 0),
            r(TEXT + 0x110, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x120, cfa::UNKNOWN, 0, rbp::SAME, 0),
            r(TEXT + 0x200, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x210, cfa::UNKNOWN, 0, rbp::SAME, 0),
        ]
    );
    assert_eq!(table.stats.unused_fdes, 1);
    assert_eq!(table.stats.fdes, 7);
}

#[test]
fn debug_frame_fills_in_where_eh_frame_has_nothing() {
    let eh = eh_frame(cie(), vec![(TEXT, 0x10, vec![])]);
    let mut table = FrameTable::default();
    let id = table.add_cie(cie());
    for (start, offset) in [(TEXT + 8, 16), (TEXT + 0x20, 24)] {
        let mut fde = FrameDescriptionEntry::new(Address::Constant(start), 0x10);
        fde.add_instruction(0, I::CfaOffset(offset));
        table.add_fde(id, fde);
    }
    let mut debug = gimli::write::DebugFrame(EndianVec::new(LittleEndian));
    table.write_debug_frame(&mut debug).unwrap();
    let debug = debug.0.into_vec();
    let t = compile_ok(&elf(&[(".eh_frame", &eh), (".debug_frame", &debug)]));
    assert_eq!(
        t.rows,
        [
            r(TEXT, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x10, cfa::UNKNOWN, 0, rbp::SAME, 0),
            r(TEXT + 0x20, cfa::RSP, 24, rbp::SAME, 0),
            r(TEXT + 0x30, cfa::UNKNOWN, 0, rbp::SAME, 0),
        ]
    );
    assert_eq!(t.stats.debug_frame_fdes, 1);
    assert_eq!(t.stats.unused_fdes, 1);
}

#[test]
fn a_malformed_fde_is_skipped_and_counted() {
    let mut eh = eh_frame(
        cie(),
        vec![(TEXT, 0x10, vec![]), (TEXT + 0x10, 0x10, vec![])],
    );
    // The second FDE's CIE pointer (after its 4-byte length) points nowhere.
    let cie_len = u32::from_le_bytes(eh[0..4].try_into().unwrap()) as usize + 4;
    let fde_len = u32::from_le_bytes(eh[cie_len..cie_len + 4].try_into().unwrap()) as usize + 4;
    let second = cie_len + fde_len;
    eh[second + 4..second + 8].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    let table = compile_ok(&elf(&[(".eh_frame", &eh)]));
    assert_eq!(table.stats.skipped_fdes, 1);
    assert_eq!(table.stats.fdes, 1);
    assert_eq!(
        table.rows,
        [
            r(TEXT, cfa::RSP, 8, rbp::SAME, 0),
            r(TEXT + 0x10, cfa::UNKNOWN, 0, rbp::SAME, 0),
        ]
    );
}

#[test]
fn too_many_rows_is_an_error_naming_the_file_and_count() {
    let fdes = (0..10).map(|i| (TEXT + 0x20 * i, 0x10, vec![])).collect();
    let data = elf(&[(".eh_frame", &eh_frame(cie(), fdes))]);
    let limits = Limits {
        max_rows: 5,
        ..Limits::default()
    };
    let err = compile_elf(&data, Path::new("/usr/lib/big.so"), &limits).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("/usr/lib/big.so") && message.contains("20 rows"),
        "{message}"
    );
    assert!(matches!(err.kind, ErrorKind::TooManyRows { rows: 20, .. }));
    // Far over: refused while reading, before the rows are all in memory.
    let fdes = (0..2000).map(|i| (TEXT + 0x20 * i, 0x10, vec![])).collect();
    let data = elf(&[(".eh_frame", &eh_frame(cie(), fdes))]);
    let err = compile_elf(&data, Path::new("/usr/lib/big.so"), &limits).unwrap_err();
    assert!(
        matches!(
            err.kind,
            ErrorKind::TooManyRows {
                at_least: true,
                limit: 5,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("or more rows"), "{err}");
}

#[test]
fn hostile_files_fail_cleanly() {
    let check = |data: &[u8]| compile_elf(data, Path::new("x"), &Limits::default());
    assert!(matches!(
        check(b"").unwrap_err().kind,
        ErrorKind::Truncated { .. }
    ));
    assert!(matches!(
        check(&[0x55; 200]).unwrap_err().kind,
        ErrorKind::NotElf
    ));
    let eh = eh_frame(cie(), vec![(TEXT, 0x10, vec![])]);
    let good = elf(&[(".eh_frame", &eh)]);
    // Every truncation: an error or a (possibly empty) table, never a panic.
    for len in 0..good.len() {
        let _ = check(&good[..len]);
    }
    // .eh_frame's header points past the end of the file.
    let mut bad = good.clone();
    let shoff = u64::from_le_bytes(bad[0x28..0x30].try_into().unwrap()) as usize;
    let eh_header = shoff + 64;
    bad[eh_header + 24..eh_header + 32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        check(&bad).unwrap_err().kind,
        ErrorKind::Truncated { .. }
    ));
    // A section size over the read limit is refused before any allocation.
    let mut bad = good.clone();
    bad[eh_header + 32..eh_header + 40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(check(&bad).is_err());
    let limits = Limits {
        max_read: 256,
        ..Limits::default()
    };
    assert!(matches!(
        compile_elf(&good, Path::new("x"), &limits)
            .unwrap_err()
            .kind,
        ErrorKind::TooLarge { .. } | ErrorKind::Truncated { .. }
    ));
    // Garbage CFI: an empty or partial table.
    let junk = elf(&[(".eh_frame", &[0xff; 64])]);
    let table = check(&junk).unwrap();
    assert!(table.rows.is_empty());
}

/// One CIE of `steps` instructions (`DW_CFA_def_cfa_offset 8`, 2 bytes
/// each) shared by `fdes` FDEs of 16 bytes of code: gimli runs the CIE's
/// steps again for each FDE, `steps × fdes` in all.
fn long_cie(steps: usize, fdes: u64) -> Vec<u8> {
    let mut cie = cie();
    for _ in 0..steps {
        cie.add_instruction(I::CfaOffset(8));
    }
    let fdes = (0..fdes).map(|i| (TEXT + 0x10 * i, 0x10, vec![])).collect();
    elf(&[(".eh_frame", &eh_frame(cie, fdes))])
}

#[test]
fn a_long_cie_shared_by_many_fdes_is_refused_within_its_work_budget() {
    // 128 KiB of CIE under 4096 FDEs: 256 KiB of CFI, 268 million steps.
    let data = long_cie(64 * 1024, 4096);
    let cfi = 64 * 1024 * 2 + 4096 * 24;
    let err = compile_elf(&data, Path::new("/usr/lib/crafted.so"), &Limits::default()).unwrap_err();
    let ErrorKind::TooMuchWork { limit, cfi: size } = err.kind else {
        panic!("{err}");
    };
    // Refused at 8 steps per byte of CFI: about 32 FDEs run the CIE
    // (8 × 256 KiB / 64k steps), not 4096.
    assert!(size.abs_diff(cfi) < 1024, "{size} bytes of CFI");
    assert_eq!(limit, 8 * size);
    let message = err.to_string();
    assert!(
        message.contains("/usr/lib/crafted.so") && message.contains("would take over"),
        "{message}"
    );

    // What is counted, for each FDE: its CIE's 1002 instructions (setting
    // the RA rule searches 1 rule: a step more), the initial rules saved
    // and the last row (1 + 1 each).
    let generous = Limits {
        work_per_byte: u64::MAX,
        max_work: u64::MAX,
        ..Limits::default()
    };
    let small = long_cie(1000, 100);
    let table = compile_elf(&small, Path::new("x"), &generous).unwrap();
    assert_eq!(table.stats.fdes, 100);
    // (Plus the DW_CFA_nops that pad the entries to 8 bytes.)
    let work = table.stats.work;
    assert!(
        (100 * (1003 + 4)..=100 * (1003 + 4 + 14)).contains(&work),
        "{work}"
    );
    // The hard cap, whatever the file's size.
    let capped = Limits {
        max_work: table.stats.work - 1,
        ..generous
    };
    assert!(matches!(
        compile_elf(&small, Path::new("x"), &capped)
            .unwrap_err()
            .kind,
        ErrorKind::TooMuchWork { .. }
    ));
}

#[test]
fn remembering_many_rules_costs_a_step_per_rule() {
    // No CIE shared: one FDE whose CIE sets 100 rules, then remembers and
    // restores them 10,000 times (gimli copies every rule each time: about
    // 1 µs per 2 bytes here, 80 times a nop's cost).
    let mut cie = cie();
    for r in 17..117 {
        cie.add_instruction(I::Offset(Register(r), -8));
    }
    for _ in 0..10_000 {
        cie.add_instruction(I::RememberState);
        cie.add_instruction(I::RestoreState);
    }
    let data = elf(&[(".eh_frame", &eh_frame(cie, vec![(TEXT, 0x10, vec![])]))]);
    let err = compile_elf(&data, Path::new("x"), &Limits::default()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::TooMuchWork { .. }), "{err}");
}

#[test]
fn ordinary_cfi_costs_about_twice_its_size() {
    // The usual short CIE under functions with a few rows each: far within
    // the budget.
    let fdes = (0..1000)
        .map(|i| {
            let instructions = vec![(1, I::CfaOffset(16)), (5, I::CfaOffset(32))];
            (TEXT + 0x40 * i, 0x40, instructions)
        })
        .collect();
    let data = elf(&[(".eh_frame", &eh_frame(cie(), fdes))]);
    let table = compile_ok(&data);
    let cfi = data.len() as u64; // over the section's size: headers too
    assert!(
        table.stats.work <= 3 * cfi,
        "{} for {cfi}",
        table.stats.work
    );
}

#[test]
fn bias_comes_from_the_segment_holding_the_offset() {
    let table = UnwindTable {
        loads: vec![
            LoadSegment {
                offset: 0,
                vaddr: 0,
                filesz: 0x1000,
                memsz: 0x1000,
                executable: false,
            },
            LoadSegment {
                offset: 0x1000,
                vaddr: 0x401000,
                filesz: 0x2000,
                memsz: 0x2000,
                executable: true,
            },
        ],
        ..UnwindTable::default()
    };
    assert_eq!(
        table.bias(0x7f00_1000, 0x1000),
        Some(0x7f00_1000 - 0x401000)
    );
    assert_eq!(table.bias(0x7f00_0000, 0x9000), None);
    // Segments that do not start on a page (lld; or GNU ld's data): the
    // mapping starts at the page holding p_offset; an executable segment
    // sharing that page with a read-only one is the one meant.
    let table = UnwindTable {
        loads: vec![
            LoadSegment {
                offset: 0,
                vaddr: 0,
                filesz: 0x5c8,
                memsz: 0x5c8,
                executable: false,
            },
            LoadSegment {
                offset: 0x5d0,
                vaddr: 0x15d0,
                filesz: 0x800,
                memsz: 0x800,
                executable: true,
            },
        ],
        ..UnwindTable::default()
    };
    assert_eq!(table.bias(0x7f00_1000, 0), Some(0x7f00_0000));
}

proptest! {
    #[test]
    fn never_panics_on_random_bytes(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = compile_elf(&data, Path::new("x"), &Limits::default());
    }

    #[test]
    fn never_panics_on_mutated_cfi(
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..16),
    ) {
        let eh = eh_frame(cie(), vec![
            (TEXT, 0x40, vec![(1, I::CfaOffset(16)), (1, I::Offset(X86_64::RBP, -16))]),
            (TEXT + 0x40, 0x40, vec![(4, I::CfaRegister(X86_64::RBP))]),
        ]);
        let mut data = elf(&[(".eh_frame", &eh)]);
        for (at, byte) in flips {
            let i = at % data.len();
            data[i] = byte;
        }
        if let Ok(table) = compile_elf(&data, Path::new("x"), &Limits::default()) {
            prop_assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        }
    }
}

fn zeroed<T: Pod + Copy>() -> T {
    *pod::from_bytes::<T>(&[0u8; 64]).unwrap().0
}
