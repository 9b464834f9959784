//! Real Debian files compile, with their table sizes and build times; hostile files fail cleanly.

use super::*;

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
