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

mod readelf;
mod real_files;

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
