//! The unwind tables against real code and real stacks.
//!
//! `tests/workloads/nofp_stack.c`, built by gcc at -O2 without frame pointers,
//! dumps its registers, raw stack and maps at the bottom of
//! main → helper_a → helper_b → recurse ×100 → leaf; the tables compiled for
//! the executable and libc, walked by `allocprof::unwind::unwind` (the
//! kernel's algorithm) over the dumped stack, must give exactly that chain
//! down to `_start`'s END row. Built with frame pointers it must give the same.
//! Every CFI row `readelf --debug-dump=frames-interp` prints for the workload,
//! python3, libc and libstdc++ must be the rule our table gives at that pc (an
//! independent decoder as the oracle). Real Debian files (python3, libc,
//! libstdc++, cc1 when installed) must compile, with their table sizes and
//! build times printed; and hostile files must fail cleanly.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use allocprof::unwind::{
    ErrorKind, Limits, Mapping, Regs, Stop, UnwindTable, compile_elf, compile_file, unwind,
};
use object::{Object, ObjectSymbol};
use profiler_common::unwind::TRUNCATED_FRAME;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("unwind-tables-{}", std::process::id()))
        .join(name);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds `nofp_stack.c` with `flags`, runs it, and returns its dump directory.
fn run_workload(name: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let exe = dir.join("nofp_stack");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/nofp_stack.c");
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("gcc is needed to build the test workloads (apt-get install gcc)");
    assert!(status.success(), "compiling nofp_stack.c {flags:?} failed");
    let out = Command::new(&exe).arg(&dir).output().unwrap();
    assert!(
        out.status.success(),
        "nofp_stack failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (exe, dir)
}

struct MapLine {
    start: u64,
    end: u64,
    offset: u64,
    executable: bool,
    path: String,
}

fn parse_maps(text: &str) -> Vec<MapLine> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (range, perms, offset) = (fields.next()?, fields.next()?, fields.next()?);
            let path = fields.nth(2).unwrap_or("").to_owned();
            let (start, end) = range.split_once('-')?;
            Some(MapLine {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                executable: perms.contains('x'),
                path,
            })
        })
        .collect()
}

/// An ELF symbol table lookup: (address, size, name) sorted by address.
struct Symbols(Vec<(u64, u64, String)>);

impl Symbols {
    fn of(path: &Path) -> Symbols {
        let data = fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let mut syms: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
            .collect();
        syms.sort();
        syms.dedup_by_key(|s| s.0);
        Symbols(syms)
    }

    fn name(&self, vaddr: u64) -> Option<&str> {
        let i = self.0.partition_point(|s| s.0 <= vaddr).checked_sub(1)?;
        let (addr, size, name) = &self.0[i];
        (vaddr < addr + (*size).max(1)).then_some(name.as_str())
    }
}

struct Frame {
    file: String,
    symbol: Option<String>,
}

/// Unwinds the workload's dumped stack with tables compiled for its files.
fn unwind_dump(dir: &Path) -> (Vec<Frame>, Stop) {
    let regs_text = fs::read_to_string(dir.join("regs")).unwrap();
    let reg = |name: &str| {
        let line = regs_text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap();
        u64::from_str_radix(line, 16).unwrap()
    };
    let regs = Regs {
        pc: reg("pc"),
        rsp: reg("rsp"),
        rbp: reg("rbp"),
    };
    let stack = fs::read(dir.join("stack")).unwrap();
    let maps = parse_maps(&fs::read_to_string(dir.join("maps")).unwrap());

    let mut tables: HashMap<String, UnwindTable> = HashMap::new();
    let mut regions = Vec::new(); // (start, end, bias, path)
    for m in maps
        .iter()
        .filter(|m| m.executable && m.path.starts_with('/'))
    {
        let table = tables.entry(m.path.clone()).or_insert_with(|| {
            compile_file(Path::new(&m.path), &Limits::default()).unwrap_or_else(|e| panic!("{e}"))
        });
        let bias = table
            .bias(m.start, m.offset)
            .unwrap_or_else(|| panic!("{}: offset {:#x} in no PT_LOAD", m.path, m.offset));
        regions.push((m.start, m.end, bias, m.path.clone()));
    }
    regions.sort_by_key(|r| r.0);
    let mappings: Vec<Mapping<'_>> = regions
        .iter()
        .map(|(start, end, bias, path)| Mapping {
            start: *start,
            end: *end,
            bias: *bias,
            rows: &tables[path].rows,
        })
        .collect();
    let read_u64 = |addr: u64| {
        let at = usize::try_from(addr.checked_sub(regs.rsp)?).ok()?;
        Some(u64::from_le_bytes(stack.get(at..at + 8)?.try_into().ok()?))
    };
    let walk = unwind(regs, &mappings, read_u64);

    let mut symbols: HashMap<String, Symbols> = HashMap::new();
    let frames = walk
        .frames
        .iter()
        .enumerate()
        .map(|(i, &pc)| {
            if pc == TRUNCATED_FRAME {
                return Frame {
                    file: "[truncated]".into(),
                    symbol: None,
                };
            }
            let Some((_, _, bias, path)) = regions.iter().find(|r| r.0 <= pc && pc < r.1) else {
                return Frame {
                    file: format!("[unmapped {pc:#x}]"),
                    symbol: None,
                };
            };
            let vaddr = pc - bias - u64::from(i > 0);
            let syms = symbols
                .entry(path.clone())
                .or_insert_with(|| Symbols::of(Path::new(path)));
            Frame {
                file: path.clone(),
                symbol: syms.name(vaddr).map(str::to_owned),
            }
        })
        .collect();
    (frames, walk.stop)
}

/// The frames a frame-pointer walk of the dump finds (what `bpf_get_stack`
/// would give): the pc, then `[rbp + 8]` along the `[rbp]` chain.
fn frame_pointer_frames(dir: &Path) -> usize {
    let regs_text = fs::read_to_string(dir.join("regs")).unwrap();
    let reg = |name: &str| {
        let value = regs_text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap();
        u64::from_str_radix(value, 16).unwrap()
    };
    let (rsp, mut rbp) = (reg("rsp"), reg("rbp"));
    let stack = fs::read(dir.join("stack")).unwrap();
    let read = |addr: u64| {
        let at = usize::try_from(addr.checked_sub(rsp)?).ok()?;
        Some(u64::from_le_bytes(stack.get(at..at + 8)?.try_into().ok()?))
    };
    let mut frames = 1;
    while let (Some(ra), Some(next)) = (read(rbp.wrapping_add(8)), read(rbp)) {
        if ra == 0 || next <= rbp || frames == 127 {
            break;
        }
        frames += 1;
        rbp = next;
    }
    frames
}

fn check_chain(exe: &Path, frames: &[Frame], stop: Stop) {
    let exe = exe.to_str().unwrap();
    let shown: Vec<String> = frames
        .iter()
        .map(|f| {
            format!(
                "{} ({})",
                f.symbol.as_deref().unwrap_or("?"),
                Path::new(&f.file).file_name().unwrap().to_string_lossy()
            )
        })
        .collect();
    println!(
        "{} frames, stop {stop:?}:\n  {}",
        frames.len(),
        shown.join("\n  ")
    );
    let in_exe = |i: usize, name: &str| {
        let f = &frames[i];
        assert!(
            f.file == exe && f.symbol.as_deref() == Some(name),
            "frame {i} is {}, expected {name} in {exe}",
            shown[i]
        );
    };
    in_exe(0, "leaf");
    for i in 1..=100 {
        in_exe(i, "recurse");
    }
    in_exe(101, "helper_b");
    in_exe(102, "helper_a");
    in_exe(103, "main");
    // Then libc's start code (__libc_start_call_main, __libc_start_main),
    // then _start, whose CFI marks the return address undefined.
    let last = frames.len() - 1;
    in_exe(last, "_start");
    // libc is stripped: __libc_start_call_main (static) has no name here,
    // __libc_start_main has its dynamic symbol.
    let libc_frames = &frames[104..last];
    let in_libc = |f: &Frame| {
        Path::new(&f.file)
            .file_name()
            .is_some_and(|n| n == "libc.so.6")
    };
    assert!(
        (1..=3).contains(&libc_frames.len())
            && libc_frames.iter().all(in_libc)
            && libc_frames.last().unwrap().symbol.as_deref() == Some("__libc_start_main"),
        "between main and _start: {:?}",
        &shown[104..last]
    );
    assert_eq!(stop, Stop::End, "the walk must end at _start's END row");
}

const NOFP: &[&str] = &[
    "-O2",
    "-fomit-frame-pointer",
    "-fno-inline",
    "-g",
    "-fasynchronous-unwind-tables",
];

#[test]
fn whole_stack_without_frame_pointers() {
    let (exe, dir) = run_workload("nofp", NOFP);
    let (frames, stop) = unwind_dump(&dir);
    check_chain(&exe, &frames, stop);
    assert!(
        !compile_file(&exe, &Limits::default())
            .unwrap()
            .frame_pointers,
        "-fomit-frame-pointer code flagged as keeping frame pointers"
    );
    // The point of the tables: frame pointers alone see (almost) nothing here.
    let by_fp = frame_pointer_frames(&dir);
    println!("frame pointers alone: {by_fp} frames");
    assert!(
        by_fp < 10,
        "a frame-pointer walk found {by_fp} frames in -fomit-frame-pointer code"
    );
}

#[test]
fn whole_stack_with_frame_pointers() {
    let (exe, dir) = run_workload(
        "fp",
        &["-O2", "-fno-omit-frame-pointer", "-fno-inline", "-g"],
    );
    let (frames, stop) = unwind_dump(&dir);
    check_chain(&exe, &frames, stop);
    // Every function keeps rbp (crt's _start aside): the kernel may step
    // its frames by frame pointer without a table lookup.
    assert!(
        compile_file(&exe, &Limits::default())
            .unwrap()
            .frame_pointers
    );
    // The control: frame pointers alone reach main here too.
    let by_fp = frame_pointer_frames(&dir);
    println!("frame pointers alone: {by_fp} frames");
    assert!(
        by_fp >= 104,
        "a frame-pointer walk found only {by_fp} frames"
    );
}

#[test]
fn whole_stack_from_debug_frame() {
    // No .eh_frame for the workload's own code (only crt's, for _start):
    // its CFI is in .debug_frame alone.
    let (exe, dir) = run_workload(
        "debug-frame",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-inline",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let stats = compile_file(&exe, &Limits::default()).unwrap().stats;
    println!("{stats:?}");
    assert!(stats.debug_frame_fdes >= 6, "{stats:?}");
    let (frames, stop) = unwind_dump(&dir);
    check_chain(&exe, &frames, stop);
}

/// Compiles one real file, prints its figures, checks the table's shape.
fn compile_real(label: &str, path: &Path) {
    let path = fs::canonicalize(path).unwrap();
    let started = Instant::now();
    let table = compile_file(&path, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    let s = table.stats;
    println!(
        "{label}: {} — {} rows, {} KiB ({} bytes), {} FDEs ({} from .debug_frame, {} skipped, \
         {} unused), {} KiB read, {:.2} steps of CFI evaluation per byte read, built in {:.1} ms",
        path.display(),
        s.rows,
        s.rows * 16 / 1024,
        s.rows * 16,
        s.fdes,
        s.debug_frame_fdes,
        s.skipped_fdes,
        s.unused_fdes,
        s.bytes_read / 1024,
        s.work as f64 / s.bytes_read as f64,
        took.as_secs_f64() * 1e3
    );
    // Real files stay far within the work budget (8 steps per byte of CFI).
    assert!(
        s.work <= 4 * s.bytes_read,
        "{label}: {} steps of CFI evaluation for {} bytes read",
        s.work,
        s.bytes_read
    );
    let mut by_rule = [0usize; 5];
    for row in &table.rows {
        by_rule[usize::from(row.cfa_rule).min(4)] += 1;
    }
    println!(
        "  rows by CFA rule: rsp {}, rbp {}, plt {}, end {}, unknown {} (gaps, signal \
         trampolines, expressions); frame pointers throughout: {}",
        by_rule[1], by_rule[2], by_rule[3], by_rule[4], by_rule[0], table.frame_pointers
    );
    // Debian builds without frame pointers: none of these may take the
    // frame-pointer fast path.
    assert!(
        !table.frame_pointers,
        "{label}: flagged as keeping frame pointers"
    );
    assert!(
        s.rows > 100 && s.fdes > 10,
        "{label}: a suspiciously small table"
    );
    assert_eq!(s.rows, table.rows.len());
    assert!(
        table.rows.windows(2).all(|w| w[0].pc < w[1].pc),
        "{label}: rows not strictly sorted"
    );
    assert!(
        table.rows.windows(2).all(|w| {
            let same = |a: &profiler_common::unwind::UnwindRow,
                        b: &profiler_common::unwind::UnwindRow| {
                (a.cfa_rule, a.cfa_offset, a.rbp_rule, a.rbp_offset)
                    == (b.cfa_rule, b.cfa_offset, b.rbp_rule, b.rbp_offset)
            };
            !same(&w[0], &w[1])
        }),
        "{label}: consecutive identical rows not merged"
    );
}

#[test]
fn real_debian_files_compile() {
    compile_real("python3", Path::new("/usr/bin/python3"));
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.exists())
    .expect("libc.so.6 not found");
    compile_real("libc", libc);
    let libstdcxx = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
    assert!(
        libstdcxx.exists(),
        "{} is missing: apt-get install libstdc++6",
        libstdcxx.display()
    );
    compile_real("libstdc++", libstdcxx);
    let cc1 = fs::read_dir("/usr/lib/gcc/x86_64-linux-gnu")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("cc1"))
        .find(|p| p.exists());
    match cc1 {
        Some(cc1) => compile_real("cc1", &cc1),
        None => println!("cc1: not installed (/usr/lib/gcc/x86_64-linux-gnu/*/cc1), not measured"),
    }
    // The largest CFI at hand (5 MiB), where installed.
    let llvm = Path::new("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1");
    if llvm.exists() {
        compile_real("libLLVM-15", llvm);
    } else {
        println!("libLLVM-15: not installed, not measured");
    }
}

#[test]
fn hostile_files_fail_cleanly() {
    let dir = scratch("hostile");
    let limits = Limits::default();
    // Garbage bytes.
    let garbage = dir.join("garbage");
    fs::write(&garbage, [0x5a; 4096]).unwrap();
    let err = compile_file(&garbage, &limits).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::NotElf), "{err}");
    assert!(err.to_string().contains("garbage"), "{err}");
    // A truncated ELF: the real executable cut after its headers.
    let (exe, _) = run_workload("hostile-exe", NOFP);
    let whole = fs::read(&exe).unwrap();
    for len in [0, 10, 64, 200, 4096, whole.len() / 2, whole.len() - 1] {
        let cut = dir.join("cut");
        fs::write(&cut, &whole[..len]).unwrap();
        match compile_file(&cut, &limits) {
            Ok(table) => println!("cut at {len}: {} rows", table.rows.len()),
            Err(e) => println!("cut at {len}: {e}"),
        }
    }
    // .eh_frame's section header pointing past the end of the file.
    let mut bad = whole.clone();
    let elf = object::read::elf::ElfFile64::<object::LittleEndian>::parse(&*whole).unwrap();
    let index = elf
        .section_by_name(".eh_frame")
        .map(|s| object::ObjectSection::index(&s).0)
        .unwrap();
    let shoff = u64::from_le_bytes(whole[0x28..0x30].try_into().unwrap()) as usize;
    let header = shoff + 64 * index;
    bad[header + 24..header + 32].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
    let err = compile_elf(&bad, Path::new("bad-offset"), &limits).unwrap_err();
    println!("{err}");
    assert!(matches!(err.kind, ErrorKind::Truncated { .. }), "{err}");
    // …and claiming 1 TiB: refused by the read limit, nothing allocated.
    let mut bad = whole.clone();
    bad[header + 32..header + 40].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = compile_elf(&bad, Path::new("bad-size"), &limits).unwrap_err();
    println!("{err}");
    assert!(
        matches!(
            err.kind,
            ErrorKind::Truncated { .. } | ErrorKind::TooLarge { .. }
        ),
        "{err}"
    );
    // Its CFI overwritten with garbage: a table (maybe empty), FDEs skipped, no panic.
    let eh = elf.section_by_name(".eh_frame").unwrap();
    let (offset, size) = object::ObjectSection::file_range(&eh).unwrap();
    let mut bad = whole.clone();
    for (i, b) in bad[offset as usize..(offset + size) as usize]
        .iter_mut()
        .enumerate()
    {
        *b = (i as u8).wrapping_mul(37) ^ 0xa5;
    }
    match compile_elf(&bad, Path::new("bad-cfi"), &limits) {
        Ok(table) => println!("garbage CFI: {:?}", table.stats),
        Err(e) => println!("garbage CFI: {e}"),
    }
}

/// A rule as `readelf --debug-dump=frames-interp` prints it, as our row
/// must say: (CFA rule, offset or None = any, rbp rule, rbp offset), or a
/// set of acceptable rules for the cases readelf cannot tell apart.
fn expected_rules(
    cfa: &str,
    rbp: Option<&str>,
    ra: Option<&str>,
) -> Vec<(u8, Option<i32>, u8, i16)> {
    use profiler_common::unwind::{cfa as c, rbp as b};
    let unknown = vec![(c::UNKNOWN, None, b::SAME, 0)];
    match ra {
        Some("c-8") => {}
        Some("u") => return vec![(c::END, None, b::SAME, 0)],
        _ => return unknown,
    }
    let offset_of = |s: &str, prefix: &str| s.strip_prefix(prefix)?.parse::<i64>().ok();
    let (cfa_rule, cfa_offset) = if let Some(n) = offset_of(cfa, "rsp+") {
        (c::RSP, Some(n))
    } else if let Some(n) = offset_of(cfa, "rbp+") {
        (c::RBP, Some(n))
    } else if cfa == "exp" {
        // The PLT expression, or any other: PLT or UNKNOWN (checked by the unit tests).
        (c::PLT, None)
    } else {
        return unknown;
    };
    let Some(cfa_offset) = cfa_offset.map_or(Some(None), |n| i32::try_from(n).ok().map(Some))
    else {
        return unknown;
    };
    let rbp_rules: Vec<(u8, i16)> = match rbp {
        None | Some("s") => vec![(b::SAME, 0)],
        // Unspecified (SAME) or DW_CFA_undefined (UNKNOWN): readelf prints both as "u".
        Some("u") => vec![(b::SAME, 0), (u8::MAX, 0)],
        Some(v) => match v.strip_prefix('c').and_then(|n| n.parse::<i64>().ok()) {
            Some(n) => match i16::try_from(n) {
                Ok(n) => vec![(b::AT_CFA, n)],
                Err(_) => return unknown,
            },
            None => return unknown,
        },
    };
    let mut out = Vec::new();
    for (rule, offset) in rbp_rules {
        if rule == u8::MAX {
            out.extend(unknown.iter().copied());
        } else {
            out.push((cfa_rule, cfa_offset, rule, offset));
            if cfa_rule == c::PLT {
                out.extend(unknown.iter().copied());
            }
        }
    }
    out
}

/// A CIE as readelf prints it: signal trampoline, and its initial row
/// (CFA, rbp, ra).
type Cie = (bool, Option<(String, Option<String>, Option<String>)>);

/// Every CFI row readelf prints for `path`, looked up in our table: the
/// same rule (mismatches listed). Returns the rows checked.
fn check_against_readelf(path: &Path) -> usize {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .expect("readelf is needed (apt-get install binutils)");
    // readelf exits 1 on libc (a debug link it cannot follow) yet prints
    // the frames: judge it by its output.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Contents of the .eh_frame section"),
        "readelf printed no CFI for {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let table = compile_file(path, &Limits::default()).unwrap();
    let matches = |pc: u64, cfa: &str, rbp: Option<&str>, ra: Option<&str>, signal: bool| {
        let Some(i) = profiler_common::unwind::find_row(&table.rows, pc) else {
            return Err(format!("{pc:#x}: no row"));
        };
        let row = table.rows[i];
        let ok = if signal {
            row.cfa_rule == profiler_common::unwind::cfa::UNKNOWN
        } else {
            expected_rules(cfa, rbp, ra)
                .iter()
                .any(|&(rule, offset, rbp_rule, rbp_offset)| {
                    row.cfa_rule == rule
                        && (rule == profiler_common::unwind::cfa::UNKNOWN
                            || rule == profiler_common::unwind::cfa::END
                            || (offset.is_none_or(|o| o == row.cfa_offset)
                                && row.rbp_rule == rbp_rule
                                && row.rbp_offset == rbp_offset))
                })
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{pc:#x}: readelf CFA {cfa} rbp {rbp:?} ra {ra:?} signal {signal}; ours {row:?}"
            ))
        }
    };
    // CIE offset → (signal trampoline, initial row); the FDE being read.
    let mut cies: HashMap<String, Cie> = HashMap::new();
    let mut in_cie: Option<String> = None;
    let mut fde: Option<(String, u64, u64, bool)> = None; // (cie, start, end, had rows)
    let mut columns: Vec<String> = Vec::new();
    let (mut checked, mut mismatches) = (0, Vec::new());
    let finish = |fde: &mut Option<(String, u64, u64, bool)>,
                  cies: &HashMap<String, Cie>,
                  checked: &mut usize,
                  mismatches: &mut Vec<String>| {
        // An FDE with no instructions has its CIE's initial row.
        if let Some((cie, start, end, false)) = fde.take()
            && end > start
            && let Some((signal, Some((cfa, rbp, ra)))) = cies.get(&cie)
        {
            *checked += 1;
            if let Err(e) = matches(start, cfa, rbp.as_deref(), ra.as_deref(), *signal) {
                mismatches.push(e);
            }
        }
    };
    for line in text.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() >= 4 && tokens[3] == "CIE" {
            finish(&mut fde, &cies, &mut checked, &mut mismatches);
            let signal = tokens.get(4).is_some_and(|a| a.contains('S'));
            cies.insert(tokens[0].to_owned(), (signal, None));
            in_cie = Some(tokens[0].to_owned());
            columns.clear();
        } else if tokens.len() >= 5 && tokens[3] == "FDE" {
            finish(&mut fde, &cies, &mut checked, &mut mismatches);
            in_cie = None;
            columns.clear();
            let cie = tokens[4].trim_start_matches("cie=").to_owned();
            let (start, end) = tokens[5]
                .trim_start_matches("pc=")
                .split_once("..")
                .unwrap();
            fde = Some((
                cie,
                u64::from_str_radix(start, 16).unwrap(),
                u64::from_str_radix(end, 16).unwrap(),
                false,
            ));
        } else if tokens.first() == Some(&"LOC") {
            columns = tokens[1..].iter().map(|s| (*s).to_owned()).collect();
        } else if tokens.len() == columns.len() + 1
            && !columns.is_empty()
            && tokens[0].len() == 16
            && u64::from_str_radix(tokens[0], 16).is_ok()
        {
            let value = |name: &str| {
                columns
                    .iter()
                    .position(|c| c == name)
                    .map(|i| tokens[i + 1].to_owned())
            };
            let (cfa, rbp, ra) = (tokens[1].to_owned(), value("rbp"), value("ra"));
            if let Some(cie) = &in_cie {
                let entry = cies.get_mut(cie).unwrap();
                entry.1 = Some((cfa, rbp, ra));
            } else if let Some((cie, start, end, had_rows)) = &mut fde {
                *had_rows = true;
                let pc = u64::from_str_radix(tokens[0], 16).unwrap();
                if pc >= *start && pc < *end {
                    let signal = cies.get(cie.as_str()).is_some_and(|c| c.0);
                    checked += 1;
                    if let Err(e) = matches(pc, &cfa, rbp.as_deref(), ra.as_deref(), signal) {
                        mismatches.push(e);
                    }
                }
            }
        }
    }
    finish(&mut fde, &cies, &mut checked, &mut mismatches);
    println!(
        "{}: {checked} readelf rows checked, {} mismatches",
        path.display(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{}: {} of {checked} rows differ from readelf, e.g. {:#?}",
        path.display(),
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    assert!(checked > 0);
    checked
}

#[test]
fn every_cfi_row_matches_readelf() {
    let (exe, _) = run_workload("readelf", NOFP);
    check_against_readelf(&exe);
    check_against_readelf(&fs::canonicalize("/usr/bin/python3").unwrap());
    for lib in ["libc.so.6", "libstdc++.so.6"] {
        let path = Path::new("/usr/lib/x86_64-linux-gnu").join(lib);
        check_against_readelf(&fs::canonicalize(path).unwrap());
    }
}
