//! The CFI decoder on hand-written `.eh_frame` data, and the walk against
//! libgcc's on this test binary's own stacks.

use super::*;

/// An `.eh_frame_hdr` + `.eh_frame` image in memory: a CIE (`zR`, pc-
/// relative FDE pointers, code alignment 1, data alignment -8, return
/// address in r16 at CFA-8, CFA = rsp+8) and one FDE per `(begin, len,
/// instructions)`, sorted by `begin`.
struct Image {
    bytes: Vec<u8>,
    hdr: usize,
    /// Where the code the FDEs describe is taken to be (1 MiB past the
    /// data: within reach of 4-byte offsets); FDE begins are offsets.
    text: usize,
}

impl Image {
    fn new(fdes: &[(usize, usize, &[u8])]) -> Image {
        Self::with_cie(&[0x0c, 7, 8, 0x90, 1], fdes)
    }

    fn with_cie(cie_init: &[u8], fdes: &[(usize, usize, &[u8])]) -> Image {
        // Layout: hdr (12 + 8n bytes) | CIE | FDEs | terminator. The
        // buffer never moves once sized, so addresses can be computed.
        let n = fdes.len();
        let mut bytes = vec![0u8; 4096 + fdes.iter().map(|f| f.2.len()).sum::<usize>()];
        let base = bytes.as_ptr() as usize;
        let text = base + PC;
        let hdr = 0;
        let eh = 12 + 8 * n;
        let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b];
        cie.extend_from_slice(cie_init);
        while (cie.len() + 4) % 8 != 0 {
            cie.push(0);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(cie.len() as u32).to_le_bytes());
        out.extend_from_slice(&cie);
        let mut table = Vec::new();
        for &(begin, len, ins) in fdes {
            let begin = text + begin;
            let at = eh + out.len();
            let mut body = Vec::new();
            body.extend_from_slice(&((at + 4 - eh) as u32).to_le_bytes());
            let field = base + at + 8;
            body.extend_from_slice(&((begin as i64 - field as i64) as i32).to_le_bytes());
            body.extend_from_slice(&(len as u32).to_le_bytes());
            body.push(0); // no augmentation data
            body.extend_from_slice(ins);
            while (body.len() + 4) % 8 != 0 {
                body.push(0);
            }
            out.extend_from_slice(&(body.len() as u32).to_le_bytes());
            out.extend_from_slice(&body);
            table.push((begin, at));
        }
        out.extend_from_slice(&[0; 4]);
        let mut h = vec![1, 0x1b, 0x03, 0x3b];
        h.extend_from_slice(&((eh - 4) as i32).to_le_bytes());
        h.extend_from_slice(&(n as u32).to_le_bytes());
        for (begin, at) in table {
            h.extend_from_slice(&((begin as i64 - (base + hdr) as i64) as i32).to_le_bytes());
            h.extend_from_slice(&((at - hdr) as i32).to_le_bytes());
        }
        bytes[..h.len()].copy_from_slice(&h);
        bytes[eh..eh + out.len()].copy_from_slice(&out);
        bytes.truncate(eh + out.len());
        Image {
            bytes,
            hdr: base + hdr,
            text,
        }
    }

    fn mem(&self) -> Mem {
        let lo = self.bytes.as_ptr() as usize;
        Mem {
            lo,
            hi: lo + self.bytes.len(),
        }
    }

    /// The row at `text + off`.
    fn row(&self, off: isize) -> Option<Row> {
        let pc = self.text.wrapping_add_signed(off);
        let fde = find_fde(self.mem(), self.hdr, pc)?;
        row_for(self.mem(), fde, pc)
    }
}

/// The text's distance from the data.
const PC: usize = 0x10_0000;

/// push rbp; mov rbp, rsp; (body); an early `pop rbp; ret` between
/// remember/restore_state; (more body).
const PROLOGUE: &[u8] = &[
    0x41, // advance 1
    0x0e, 16, // CFA = rsp+16
    0x86, 2,    // rbp at CFA-16
    0x43, // advance 3
    0x0d, 6,    // CFA = rbp+16
    0x50, // advance 0x10
    0x0a, // remember_state
    0x0c, 7, 8,    // CFA = rsp+8
    0xc6, // restore rbp (same value)
    0x41, // advance 1
    0x0b, // restore_state
];

fn row(reg: u64, off: i64, rbp: Rule) -> Row {
    Row {
        cfa_reg: reg,
        cfa_off: off,
        cfa_unknown: false,
        rbp,
        ra: Rule::At(-8),
    }
}

#[test]
fn rows_follow_the_cfa_program() {
    let img = Image::new(&[(0, 0x100, PROLOGUE)]);
    assert_eq!(img.row(0), Some(row(RSP, 8, Rule::Same)));
    assert_eq!(img.row(1), Some(row(RSP, 16, Rule::At(-16))));
    assert_eq!(img.row(3), Some(row(RSP, 16, Rule::At(-16))));
    assert_eq!(img.row(4), Some(row(RBP, 16, Rule::At(-16))));
    // The early return, then the body again with the remembered row.
    assert_eq!(img.row(0x14), Some(row(RSP, 8, Rule::Same)));
    assert_eq!(img.row(0x15), Some(row(RBP, 16, Rule::At(-16))));
    assert_eq!(img.row(0xff), Some(row(RBP, 16, Rule::At(-16))));
    // Outside the FDE, or before the first one: none.
    assert_eq!(img.row(0x100), None);
    assert_eq!(img.row(-1), None);
}

#[test]
fn the_table_is_binary_searched() {
    let programs: Vec<[u8; 2]> = (0..37).map(|i| [0x0e, 16 + i as u8]).collect();
    let fdes: Vec<(usize, usize, &[u8])> = programs
        .iter()
        .enumerate()
        .map(|(i, p)| (0x100 * i, 0x80, &p[..]))
        .collect();
    let img = Image::new(&fdes);
    for i in 0..37 {
        let at = 0x100 * i as isize + 0x40;
        assert_eq!(
            img.row(at).map(|r| r.cfa_off),
            Some(16 + i64::from(i)),
            "{i}"
        );
        // The gap after each FDE is covered by none.
        assert_eq!(img.row(at + 0x80), None, "{i}");
    }
}

#[test]
fn what_it_does_not_model_ends_the_walk() {
    let stack = [0usize; 8];
    let lo = stack.as_ptr() as usize;
    let mem = Mem { lo, hi: lo + 64 };
    // A CFA expression (glibc's signal trampoline): a row it cannot follow.
    let img = Image::new(&[(0, 0x10, &[0x0f, 2, 0x77, 0x00])]);
    let r = img.row(0).unwrap();
    assert!(r.cfa_unknown);
    assert_eq!(step(&r, lo, Some(lo), mem), None);
    // The return address by expression, or in another register.
    let img = Image::new(&[
        (0, 0x10, &[0x10, 16, 1, 0x00]),
        (0x10, 0x10, &[0x09, 16, 3]),
    ]);
    assert_eq!(img.row(0).unwrap().ra, Rule::Unknown);
    assert_eq!(img.row(0x10).unwrap().ra, Rule::Unknown);
    assert_eq!(step(&img.row(0).unwrap(), lo, Some(lo), mem), None);
    // A CFA from a register it does not track (a realigned stack's r10).
    let r = Image::new(&[(0, 0x10, &[0x0c, 10, 0])]).row(0).unwrap();
    assert_eq!(step(&r, lo, Some(lo), mem), None);
    // An opcode it does not know, and DW_CFA_set_loc.
    assert_eq!(Image::new(&[(0, 0x10, &[0x3f])]).row(0), None);
    assert_eq!(Image::new(&[(0, 0x10, &[0x01, 0, 0, 0, 0])]).row(0), None);
    // More than MAX_OPS instructions.
    let nops = vec![0u8; MAX_OPS + 8];
    assert_eq!(Image::new(&[(0, 0x10, &nops)]).row(0), None);
    // remember_state nested too deep, or restore_state without one.
    assert_eq!(Image::new(&[(0, 0x10, &[0x0a; 5])]).row(0), None);
    assert_eq!(Image::new(&[(0, 0x10, &[0x0b])]).row(0), None);
}

#[test]
fn reads_stay_inside_the_segment() {
    let img = Image::new(&[(0, 0x100, PROLOGUE)]);
    let full = img.mem();
    let fde = find_fde(full, img.hdr, img.text).unwrap();
    assert!(row_for(full, fde, img.text + 4).is_some());
    // The segment ends inside the FDE, inside the CIE, inside the table.
    for hi in [fde + 12, fde - 8, img.hdr + 14] {
        let cut = Mem { lo: full.lo, hi };
        let got = find_fde(cut, img.hdr, img.text).and_then(|f| row_for(cut, f, img.text + 4));
        assert_eq!(got, None, "{:#x}", hi - full.lo);
    }
    // A CIE pointer out of the segment.
    let mut bytes = img.bytes.clone();
    let at = fde - full.lo + 4;
    bytes[at..at + 4].copy_from_slice(&0x7fff_0000u32.to_le_bytes());
    let lo = bytes.as_ptr() as usize;
    let moved = Mem {
        lo,
        hi: lo + bytes.len(),
    };
    assert_eq!(row_for(moved, fde - full.lo + lo, img.text + 4), None);
}

#[test]
fn steps_read_the_stack_only_inside_it_and_only_upwards() {
    let mut words = Box::new([0usize; 16]);
    let lo = words.as_ptr() as usize;
    let mem = Mem { lo, hi: lo + 128 };
    words[3] = 0x1234; // return address at CFA-8 for CFA = lo + 32
    words[2] = lo + 100; // saved rbp at CFA-16
    let r = row(RSP, 32, Rule::At(-16));
    assert_eq!(
        step(&r, lo, None, mem),
        Some(Some((0x1234, lo + 32, Some(lo + 100))))
    );
    // rbp-based: needs a known rbp.
    let r = row(RBP, 16, Rule::At(-16));
    assert_eq!(step(&r, lo, None, mem), None);
    assert_eq!(
        step(&r, lo, Some(lo + 16), mem),
        Some(Some((0x1234, lo + 32, Some(lo + 100))))
    );
    // A CFA at or below the stack pointer, or above the stack: never.
    assert_eq!(step(&row(RSP, 0, Rule::Same), lo, None, mem), None);
    assert_eq!(
        step(&row(RBP, 16, Rule::Same), lo, Some(lo - 64), mem),
        None
    );
    assert_eq!(step(&row(RSP, 200, Rule::Same), lo, None, mem), None);
    // A saved word outside the stack or misaligned.
    let mut r = row(RSP, 32, Rule::Same);
    r.ra = Rule::At(-40);
    assert_eq!(step(&r, lo, None, mem), None);
    r.ra = Rule::At(-7);
    assert_eq!(step(&r, lo, None, mem), None);
    // An undefined return address is the bottom of the stack.
    r.ra = Rule::Undefined;
    assert_eq!(step(&r, lo, None, mem), Some(None));
}

#[link(name = "gcc_s")]
unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> i32,
        arg: *mut c_void,
    ) -> i32;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

extern "C" fn collect(ctx: *mut c_void, arg: *mut c_void) -> i32 {
    // SAFETY: `arg` is the Vec passed below, alive for the whole walk.
    let v = unsafe { &mut *arg.cast::<Vec<usize>>() };
    // SAFETY: `ctx` is the context libgcc passes to this callback.
    v.push(unsafe { _Unwind_GetIP(ctx) });
    0
}

/// Our walk and libgcc's from the same frame, `depth` calls down.
#[inline(never)]
fn both_walks(depth: u32) -> (Vec<usize>, (usize, End), [u64; FRAMES]) {
    if depth > 0 {
        return core::hint::black_box(both_walks(depth - 1));
    }
    let fp: usize;
    // SAFETY: copies a register.
    unsafe { core::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack)) };
    let mut libgcc = Vec::new();
    // SAFETY: the callback only pushes into `libgcc`.
    unsafe { _Unwind_Backtrace(collect, (&raw mut libgcc).cast()) };
    // SAFETY: this function's own frame (it keeps a frame pointer).
    let (rbp, ra) = unsafe { (*(fp as *const usize), *((fp + 8) as *const usize)) };
    let (lo, hi) = crate::ledger::stack_mapping_for_test(fp).expect("the stack's mapping");
    let mut out = [0; FRAMES];
    let r = walk(ra, fp + 16, rbp, Mem { lo, hi }, &mut out);
    (libgcc, r, out)
}

#[test]
fn the_walk_matches_libgccs_and_reaches_the_threads_start() {
    // A thread of its own: a short stack, whose bottom the walk reaches.
    let (libgcc, (n, end), out) = std::thread::spawn(|| both_walks(5)).join().unwrap();
    let ours: Vec<usize> = out[..n].iter().map(|&f| f as usize).collect();
    let from = libgcc
        .iter()
        .position(|&ip| ip == ours[0])
        .unwrap_or_else(|| panic!("ours {ours:x?} libgcc {libgcc:x?}"));
    // libgcc also reports the outermost frame's null return address.
    assert_eq!(libgcc.last(), Some(&0));
    assert_eq!(ours, libgcc[from..libgcc.len() - 1], "ours vs libgcc's");
    assert_eq!(end, End::Bottom, "{ours:x?}");
    // The five recursive calls return into `both_walks` (its code is under
    // 1 KiB, release or debug: the call site lies 0x355 bytes in a debug
    // build).
    let f = both_walks as *const () as usize;
    assert!(
        ours.iter().filter(|&&a| a > f && a < f + 1024).count() >= 5,
        "{ours:x?} (both_walks at {f:#x})"
    );
}

#[test]
fn a_deep_stack_fills_the_frames() {
    let (libgcc, (n, end), out) = both_walks(40);
    assert_eq!((n, end), (FRAMES, End::Full));
    let ours: Vec<usize> = out.iter().map(|&f| f as usize).collect();
    let from = libgcc.iter().position(|&ip| ip == ours[0]).unwrap();
    assert_eq!(ours, libgcc[from..from + FRAMES]);
}

#[test]
fn code_no_object_holds_ends_the_walk_cut() {
    let words = [0usize; 8];
    let lo = words.as_ptr() as usize;
    let mut out = [0; FRAMES];
    // A return address into anonymous memory (as JIT code's): recorded,
    // then the walk ends, cut short.
    let jit = words.as_ptr() as usize + 8;
    let (n, end) = walk(jit, lo, lo, Mem { lo, hi: lo + 64 }, &mut out);
    assert_eq!((n, end), (1, End::Cut));
    assert_eq!(out[0] as usize, jit);
}

/// Rows from the cache, and the proof they came from it: asked again with
/// no `.eh_frame_hdr` to search (0), the row is still there.
#[test]
fn cached_rows_are_the_decoded_ones() {
    let programs: Vec<[u8; 2]> = (0..37).map(|i| [0x0e, 16 + i as u8]).collect();
    let fdes: Vec<(usize, usize, &[u8])> = std::iter::once((0x4000, 0x100, PROLOGUE))
        .chain(
            programs
                .iter()
                .enumerate()
                .map(|(i, p)| (0x100 * i, 0x80, &p[..])),
        )
        .collect();
    let mut fdes = fdes;
    fdes.sort_by_key(|f| f.0);
    let img = Image::new(&fdes);
    let mem = img.mem();
    for off in (0..0x4100).step_by(3) {
        let at = img.text + off;
        let decoded = find_fde(mem, img.hdr, at).and_then(|f| row_for(mem, f, at));
        assert_eq!(cache::row_at(mem, img.hdr, at), decoded, "{off:#x}");
        if decoded.is_some() {
            assert_eq!(
                cache::row_at(mem, 0, at),
                decoded,
                "{off:#x} from the cache"
            );
        }
    }
}

/// An FDE rewritten where a cached one was (an object unloaded, another
/// loaded at its address): its row is decoded again.
#[test]
fn a_row_whose_fde_changed_is_decoded_again() {
    let mut img = Image::new(&[(0, 0x100, &[0x0e, 24])]);
    let at = img.text + 0x10;
    assert_eq!(
        cache::row_at(img.mem(), img.hdr, at).map(|r| r.cfa_off),
        Some(24)
    );
    assert_eq!(cache::row_at(img.mem(), 0, at).map(|r| r.cfa_off), Some(24));
    let fde = find_fde(img.mem(), img.hdr, at).unwrap() - img.mem().lo;
    // Length, CIE pointer, begin, range, augmentation length: the program.
    assert_eq!(img.bytes[fde + 17..fde + 19], [0x0e, 24]);
    img.bytes[fde + 18] = 40;
    assert_eq!(cache::row_at(img.mem(), 0, at), None, "a miss");
    assert_eq!(
        cache::row_at(img.mem(), img.hdr, at).map(|r| r.cfa_off),
        Some(40)
    );
}

#[test]
fn rows_pack_into_three_words_or_are_not_cached() {
    let rules = [
        Rule::Same,
        Rule::Undefined,
        Rule::Unknown,
        Rule::At(-16),
        Rule::At(i64::from(i32::MIN)),
        Rule::At(i64::from(i32::MAX)),
    ];
    for rbp in rules {
        for ra in rules {
            for (cfa_reg, cfa_off, cfa_unknown) in [
                (RSP, 8, false),
                (RBP, -4096, false),
                (10, i64::MIN, true),
                (u64::from(u32::MAX), i64::MAX, false),
            ] {
                let row = Row {
                    cfa_reg,
                    cfa_off,
                    cfa_unknown,
                    rbp,
                    ra,
                };
                assert_eq!(cache::unpack(cache::pack(&row).unwrap()), row);
            }
        }
    }
    let far = Row {
        cfa_reg: RSP,
        cfa_off: 8,
        cfa_unknown: false,
        rbp: Rule::At(1 << 40),
        ra: Rule::At(-8),
    };
    assert_eq!(cache::pack(&far), None);
    assert_eq!(
        cache::pack(&Row {
            cfa_reg: 1 << 33,
            ..far
        }),
        None
    );
}

/// Threads reading and replacing the same entries at once: every row read
/// is the one of its return address, never a mix of two.
#[test]
fn rows_written_while_read_are_never_torn() {
    let programs: Vec<[u8; 3]> = (0..64).map(|i| [0x0c, 7, 16 + i as u8]).collect();
    let fdes: Vec<(usize, usize, &[u8])> = programs
        .iter()
        .enumerate()
        .map(|(i, p)| (0x100 * i, 0x100, &p[..]))
        .collect();
    let img = Image::new(&fdes);
    let (mem, hdr, text) = (img.mem(), img.hdr, img.text);
    // Return addresses of different FDEs sharing a cache entry.
    let mut by_slot: std::collections::HashMap<usize, Vec<(usize, i64)>> = Default::default();
    for off in 0..0x4000 {
        by_slot
            .entry(cache::slot_index(text + off))
            .or_default()
            .push((text + off, 16 + (off / 0x100) as i64));
    }
    let shared: Vec<(usize, i64)> = by_slot
        .into_values()
        .filter(|v| v.iter().any(|&(_, o)| o != v[0].1))
        .take(8)
        .flatten()
        .collect();
    assert!(shared.len() >= 16, "no entries shared by two FDEs");
    std::thread::scope(|s| {
        for t in 0..4 {
            let shared = &shared;
            s.spawn(move || {
                for round in 0..20_000 {
                    let (at, off) = shared[(round * 7 + t * 3) % shared.len()];
                    let row = cache::row_at(mem, hdr, at).expect("a row");
                    assert_eq!(
                        (row.cfa_reg, row.cfa_off, row.ra),
                        (RSP, off, Rule::At(-8)),
                        "{at:#x}"
                    );
                }
            });
        }
    });
}
