//! Whole stacks in code built without frame pointers: the kernel walks them
//! with the unwind tables allocprof compiled from the files' call-frame
//! information. Real kernel programs, a real C program built -O2 without
//! frame pointers, real samples.

mod common;

use std::{
    io::{BufRead, BufReader, Write},
    process::Command,
    time::{Duration, Instant},
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::{ProcessProfile, Profile, StackProfile},
    session::{Session, Target},
    symbolize::{BEFORE_TABLES_MARKER, DEPTH_CUT_MARKER, Frame},
};
use common::{Proc, RATE};
use profiler_common::DropReason;

/// How a site's stacks must read from the allocation up (innermost first,
/// other frames may sit between), its block count and size.
struct Site {
    chain: &'static [&'static str],
    count: u64,
    size: u64,
}

const SITES: [Site; 3] = [
    Site {
        chain: &["xmalloc", "site_one_level", "main"],
        count: 2000,
        size: 4096,
    },
    Site {
        chain: &[
            "xmalloc",
            "xmalloc_twice_removed",
            "site_two_levels",
            "main",
        ],
        count: 1000,
        size: 8192,
    },
    Site {
        chain: &["recurse", "main"],
        count: 512,
        size: 16384,
    },
];

/// A session on `pid` once the unwind tables of its files are built and
/// loaded (so its allocations are walked with them from the first).
fn session_with_tables(pid: u32, limits: Limits) -> Session {
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), limits).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        session.poll_events();
        let status = session.unwind_status();
        if status.loading == 0 && status.ready > 0 {
            return session;
        }
        assert!(
            Instant::now() < deadline,
            "unwind tables not loaded: {status:?}, {:?}",
            session.warnings
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a workload (`go`/`ready` protocol) once it maps `library` and the
/// tables of its files are loaded; returns it, waiting for `exit`, and its
/// complete profile.
fn profiled_with_tables(cmd: Command, library: &str) -> (Proc, Profile) {
    let (w, profile, _) = profiled_with(cmd, library, Limits::default());
    (w, profile)
}

/// As [`profiled_with_tables`], with `limits`; also returns the session's
/// warnings.
fn profiled_with(cmd: Command, library: &str, limits: Limits) -> (Proc, Profile, Vec<String>) {
    let mut w = Proc::spawn(cmd);
    common::wait_for_mapping(w.pid(), library);
    let mut session = session_with_tables(w.pid(), limits);
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    (w, profile, std::mem::take(&mut session.warnings))
}

/// Whether `frames` (innermost first) hold `chain` in that order.
fn holds_chain(frames: &[Frame], chain: &[&str]) -> bool {
    let mut want = chain.iter().peekable();
    for f in frames {
        if want.peek().is_some_and(|w| &*f.function == **w) {
            want.next();
        }
    }
    want.peek().is_none()
}

fn stacks_of<'a>(p: &'a ProcessProfile, function: &str) -> Vec<&'a StackProfile> {
    p.stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == function))
        .collect()
}

#[test]
fn stacks_without_frame_pointers_are_whole_and_estimates_unbiased() {
    common::require_bpf();
    let exe = common::compile_c(
        "nofp_sites.c",
        &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    let (mut w, profile) = profiled_with_tables(Command::new(exe), "liballocprof.so");
    let p = common::process(&profile, w.pid());

    for site in &SITES {
        let leaf = site.chain[site.chain.len() - 2];
        let stacks = stacks_of(p, leaf);
        assert!(!stacks.is_empty(), "no stack reaches {leaf}: {p:#?}");
        for s in &stacks {
            assert!(
                holds_chain(&s.frames, site.chain),
                "a stack of {leaf} lacks {:?}: {:?}",
                site.chain,
                s.frames.iter().map(|f| &f.function).collect::<Vec<_>>()
            );
        }
        let live: f64 = stacks.iter().map(|s| s.totals.live_bytes).sum();
        let (truth, sigma) = common::truth_and_sigma(site.count, site.size, RATE);
        assert!(
            (live - truth).abs() <= 5.0 * sigma,
            "{leaf}: {live} vs {truth} (sigma {sigma})"
        );
    }
    let deepest = stacks_of(p, "recurse")
        .iter()
        .map(|s| {
            s.frames
                .iter()
                .filter(|f| &*f.function == "recurse")
                .count()
        })
        .max()
        .unwrap();
    assert_eq!(deepest, 101, "the whole 100-deep recursion is walked");
    assert_eq!(
        p.drops[DropReason::StackTruncated as usize],
        0,
        "no walk was cut short"
    );
    // One site, one stack: no garbage frames make each sample its own.
    assert!(
        stacks_of(p, "site_one_level").len() <= 2,
        "{:#?}",
        stacks_of(p, "site_one_level")
    );
    w.send("exit");
}

/// `nocfi_main.c` over `libnocfi.so`, a library without call-frame
/// information (its frames end every walk in a truncation marker).
fn nocfi_workload() -> Command {
    // A directory per call: tests running at once must not rebuild a
    // library another one runs.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = common::scratch_dir(&format!("nocfi-{}-{call}", std::process::id()));
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads");
    // No -g either: debug info would bring a .debug_frame. (The C runtime's
    // own start files still bring a small .eh_frame for their functions.)
    let status = Command::new("gcc")
        .args([
            "-O2",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
        ])
        .args(["-fno-unwind-tables", "-shared", "-fPIC", "-o"])
        .arg(dir.join("libnocfi.so"))
        .arg(src.join("nocfi.c"))
        .status()
        .expect("gcc");
    assert!(status.success());
    let exe = common::compile_c(
        "nocfi_main.c",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-L",
            dir.to_str().unwrap(),
            "-lnocfi",
            &format!("-Wl,-rpath,{}", dir.display()),
        ],
    );
    Command::new(exe)
}

#[test]
fn a_library_without_call_frame_information_ends_its_stacks_in_one_marker() {
    common::require_bpf();
    let (mut w, profile) = profiled_with_tables(nocfi_workload(), "libnocfi.so");
    let p = common::process(&profile, w.pid());
    let stacks = stacks_of(p, "nocfi_alloc");
    assert!(!stacks.is_empty(), "{p:#?}");
    for s in &stacks {
        let names: Vec<&str> = s.frames.iter().map(|f| &*f.function).collect();
        assert_eq!(
            names.last().copied(),
            Some("[truncated: no unwind info for libnocfi.so]"),
            "{names:?}"
        );
        assert_eq!(
            names.iter().filter(|n| n.starts_with("[truncated")).count(),
            1,
            "{names:?}"
        );
    }
    assert!(stacks.len() <= 2, "one site, one stack: {stacks:#?}");
    // Counted as well: the kernel says how many samples were cut short.
    let truncated = p.drops[DropReason::StackTruncated as usize];
    assert!(
        truncated >= p.alloc_events / 2 && truncated <= p.alloc_events,
        "{truncated} of {} samples counted truncated",
        p.alloc_events
    );
    let live: f64 = stacks.iter().map(|s| s.totals.live_bytes).sum();
    let (truth, sigma) = common::truth_and_sigma(1000, 8192, RATE);
    assert!((live - truth).abs() <= 5.0 * sigma, "{live} vs {truth}");
    w.send("exit");
}

#[test]
fn verbose_diagnostics_say_where_walks_are_cut_short() {
    common::require_bpf();
    let limits = Limits {
        diagnostics: true,
        ..Limits::default()
    };
    let (mut w, profile, warnings) = profiled_with(nocfi_workload(), "libnocfi.so", limits);
    let p = common::process(&profile, w.pid());
    let truncated = p.drops[DropReason::StackTruncated as usize];
    let lines: Vec<&String> = warnings
        .iter()
        .filter(|l| l.starts_with(&format!("kernel: pid {}: stack walk cut short", w.pid())))
        .collect();
    // The 1st, 2nd, 4th... of the process's cut walks: one line per power
    // of two up to the count.
    assert!(truncated > 0, "{warnings:?}");
    let expected = (u64::BITS - truncated.leading_zeros()) as usize;
    assert!(
        !lines.is_empty() && lines.len() <= expected,
        "{} lines for {truncated} cut walks: {warnings:?}",
        lines.len()
    );
    assert!(lines[0].contains("cut short so far: 1)"), "{}", lines[0]);
    assert!(lines[0].contains("covers it: 1;"), "{}", lines[0]);
    w.send("exit");
}

#[test]
fn debian_s_python3_without_frame_pointers_has_stacks_that_reach_main() {
    common::require_bpf();
    let script = "import sys\n\
                  sys.stdin.readline()\n\
                  keep = [bytearray(65536) for _ in range(1024)]\n\
                  print('ready', flush=True)\n\
                  sys.stdin.readline()\n";
    // Debian's own, not whatever `python3` is first on PATH (a pyenv shim
    // is a bash script that runs another python).
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.args(["-c", script]).env("PYTHONMALLOC", "malloc");
    let (mut w, profile) = profiled_with_tables(cmd, "liballocprof.so");
    let p = common::process(&profile, w.pid());
    let reaches_main = |s: &&StackProfile| {
        s.frames
            .iter()
            .any(|f| f.function.starts_with("__libc_start_main") || &*f.function == "Py_BytesMain")
    };
    // The kernel's walks: what python3 allocated once allocprof attached.
    // Its start-up heap, from before, comes from the allocator's ledger,
    // whose records keep 32 frames: python's start-up stacks are deeper.
    let since_attach = |s: &StackProfile| s.totals.live_bytes - s.totals.before_attach_bytes;
    let whole: f64 = p.stacks.iter().filter(reaches_main).map(since_attach).sum();
    let walked: f64 = p.stacks.iter().map(since_attach).sum();
    let live = p.totals.live_bytes;
    assert!(
        whole >= 0.99 * walked && walked >= 0.9 * live,
        "{:.1} % of {walked} live bytes walked by the kernel on stacks that reach main \
         ({live} live): {:#?}",
        100.0 * whole / walked,
        p.stacks
            .iter()
            .map(|s| s.frames.iter().map(|f| &*f.function).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    let (truth, sigma) = common::truth_and_sigma(1024, 65536, RATE);
    assert!(
        (live - truth).abs() <= 5.0 * sigma + 4.0 * 1_048_576.0,
        "live {live} vs about {truth}"
    );
    w.send("exit");
}

fn names(s: &StackProfile) -> Vec<&str> {
    s.frames.iter().map(|f| &*f.function).collect()
}

#[test]
fn cxx_operator_new_through_the_standard_library_without_frame_pointers() {
    common::require_bpf();
    let exe = common::compile_c(
        "nofp_cxx.cpp",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-lstdc++",
        ],
    );
    let (mut w, profile) = profiled_with_tables(Command::new(exe), "liballocprof.so");
    let p = common::process(&profile, w.pid());
    // The exports say the tables are in: JSON and the report's header.
    let unwind = allocprof::output::export::json::report(&profile).unwind;
    assert!(
        unwind.files_ready >= 5 && unwind.files_loading == 0 && unwind.files_unavailable == 0,
        "{unwind:?}"
    );
    let text = allocprof::output::report::render(&profile, Default::default());
    let header = text.lines().next().unwrap();
    assert!(
        header.contains(&format!(
            "unwind tables for {0} of {0} files",
            unwind.files_ready
        )),
        "{header}"
    );
    let all: Vec<Vec<&str>> = p.stacks.iter().map(names).collect();
    // (leaf function, chain from operator new up, live bytes and sigma)
    let (strings, strings_sigma) = common::truth_and_sigma(2000, 4096, RATE);
    let (buffer, buffer_sigma) = common::truth_and_sigma(1, 2048 * 32, RATE);
    let (foos, foos_sigma) = common::truth_and_sigma(1000, 8192, RATE);
    let sites = [
        (
            "grow_vector()",
            &["operator new(unsigned long)", "grow_vector()", "main"][..],
            strings + buffer,
            strings_sigma.hypot(buffer_sigma),
        ),
        (
            "ns::make_foo()",
            &[
                "operator new(unsigned long)",
                "ns::make_foo()",
                "ns::f()",
                "main",
            ][..],
            foos,
            foos_sigma,
        ),
    ];
    for (function, chain, truth, sigma) in sites {
        let stacks = stacks_of(p, function);
        assert!(!stacks.is_empty(), "no stack reaches {function}: {all:#?}");
        for s in &stacks {
            assert!(
                holds_chain(&s.frames, chain),
                "{:?} lacks {chain:?}",
                names(s)
            );
            assert!(
                names(s).iter().all(|n| !n.starts_with('[')),
                "no markers, no unknown frames: {:?}",
                names(s)
            );
        }
        let live: f64 = stacks.iter().map(|s| s.totals.live_bytes).sum();
        assert!(
            (live - truth).abs() <= 5.0 * sigma,
            "{function}: {live} vs {truth} (sigma {sigma})"
        );
        assert!(stacks.len() <= 4, "{function}: {all:#?}");
    }
    // The strings' buffers come from libstdc++'s basic_string code, walked
    // through with its tables on the way from operator new to grow_vector.
    assert!(
        stacks_of(p, "grow_vector()").iter().any(|s| names(s)
            .iter()
            .any(|n| n.starts_with("std::__cxx11::basic_string"))),
        "{all:#?}"
    );
    w.send("exit");
}

#[test]
fn a_signal_handler_that_allocates_ends_cleanly_at_the_signal_frame() {
    common::require_bpf();
    let exe = common::compile_c(
        "nofp_signal.c",
        &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    let (mut w, profile) = profiled_with_tables(Command::new(exe), "liballocprof.so");
    let p = common::process(&profile, w.pid());
    let stacks = stacks_of(p, "handler_alloc");
    assert!(!stacks.is_empty(), "{p:#?}");
    for s in &stacks {
        let names = names(s);
        assert!(
            holds_chain(&s.frames, &["handler_alloc", "on_signal"]),
            "{names:?}"
        );
        // The handler returns into libc's signal trampoline (__restore_rt,
        // unnamed in Debian's stripped libc); its CFI describes the
        // interrupted registers with DWARF expressions, which the tables
        // leave without a rule: the walk ends there in one marker.
        let after = &names[names.iter().position(|n| *n == "on_signal").unwrap() + 1..];
        assert!(after.len() <= 2, "garbage after the handler: {names:?}");
        if let [trampoline, ..] = after {
            assert!(
                trampoline.starts_with("libc.so.6+") || *trampoline == "__restore_rt",
                "{names:?}"
            );
        }
        assert!(
            after.iter().filter(|n| n.starts_with('[')).count() <= 1
                && after.iter().rev().skip(1).all(|n| !n.starts_with('[')),
            "at most one marker, last: {names:?}"
        );
    }
    assert!(stacks.len() <= 2, "one site, one stack: {stacks:#?}");
    let live: f64 = stacks.iter().map(|s| s.totals.live_bytes).sum();
    let (truth, sigma) = common::truth_and_sigma(500, 16384, RATE);
    assert!((live - truth).abs() <= 5.0 * sigma, "{live} vs {truth}");
    w.send("exit");
}

#[test]
fn a_churn_without_frame_pointers_profiled_system_wide_keeps_one_site_in_a_handful_of_stacks() {
    common::require_bpf();
    let exe = common::compile_c("nofp_churn.c", &["-O2", "-fomit-frame-pointer", "-pthread"]);
    // Every allocation sampled: 400,000 samples of one call site.
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "1");
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        session.poll_events();
        let status = session.unwind_status();
        if status.loading == 0 && status.ready > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "unwind tables not loaded: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    w.send("go");
    w.expect("done");
    let churned = started.elapsed();
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    let stacks = stacks_of(p, "churn_alloc");
    let all: Vec<Vec<&str>> = stacks.iter().map(|s| names(s)).collect();
    let samples: u64 = stacks.iter().map(|s| s.totals.alloc_samples).sum();
    eprintln!(
        "{samples} samples of churn_alloc in {} stacks, {churned:?}: {all:#?}",
        stacks.len()
    );
    assert!(samples >= 390_000, "{samples} samples: {:?}", p.drops);
    assert!(stacks.len() <= 8, "{all:#?}");
    for s in &stacks {
        assert!(
            holds_chain(&s.frames, &["churn_alloc", "worker"]),
            "{:?}",
            names(s)
        );
    }
    for reason in [
        DropReason::StackMapFull,
        DropReason::AggMapFull,
        DropReason::StackRateLimited,
    ] {
        assert_eq!(p.drops[reason as usize], 0, "{reason:?}: {:?}", p.drops);
    }
    w.send("exit");
}

#[test]
fn a_rust_program_without_frame_pointers_has_whole_stacks() {
    common::require_bpf();
    let started = Instant::now();
    let exe = common::example_without_frame_pointers("rust_sites");
    eprintln!("built without frame pointers in {:?}", started.elapsed());
    // The allocprof global allocator: no preload.
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", "")
        .env("ALLOCPROF_RATE", RATE.to_string());
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    let mut session = session_with_tables(pid, Limits::default());
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    for (site, ..) in common::SITES {
        let function = format!("rust_sites::{site}");
        let stacks = stacks_of(p, &function);
        assert!(!stacks.is_empty(), "no stack reaches {function}: {p:#?}");
        for s in &stacks {
            assert!(
                holds_chain(
                    &s.frames,
                    &[
                        &function,
                        "rust_sites::main",
                        "std::rt::lang_start_internal",
                        "main"
                    ]
                ),
                "{:?}",
                names(s)
            );
            assert!(
                names(s).iter().all(|n| !n.starts_with('[')),
                "{:?}",
                names(s)
            );
        }
    }
    common::assert_renamed_sites_within_bounds(p, "rust_sites::site_");
    w.send("exit");
}

/// `crafted_cfi_main.c` over `libcrafted_cfi.so`, whose `.eh_frame` is one
/// CIE of `nops` `DW_CFA_nop`s shared by `fdes` FDEs of one byte of code
/// each (written as assembly, linked by gcc like any library): gimli runs
/// the CIE's instructions again for every FDE, so compiling it unbounded
/// costs `nops × fdes` steps.
fn crafted_cfi_workload(nops: usize, fdes: usize) -> Command {
    use std::fmt::Write as _;
    let dir = common::scratch_dir(&format!("crafted-cfi-{}-{nops}-{fdes}", std::process::id()));
    let mut s = String::new();
    // FDEs point at a local label: a pc-relative reference to the global
    // symbol would need a text relocation.
    s +=
        "\t.text\n\t.globl crafted_code\n\t.type crafted_code, @function\ncrafted_code:\n.Lcode:\n";
    writeln!(s, "\t.fill {fdes}, 1, 0xc3").unwrap();
    s += "\t.section .eh_frame,\"a\",@progbits\n\t.balign 8\ncie:\n";
    s += "\t.long cie_end - cie_id\ncie_id:\n\t.long 0\n\t.byte 1\n\t.string \"zR\"\n";
    // Code and data alignment, return address column, augmentation data:
    // FDE pointers pc-relative 4-byte. Then CFA = rsp + 8, RA at CFA - 8.
    s += "\t.uleb128 1\n\t.sleb128 -8\n\t.uleb128 16\n\t.uleb128 1\n\t.byte 0x1b\n";
    s += "\t.byte 0x0c, 0x07, 0x08\n\t.byte 0x90, 0x01\n";
    // The nops, then DW_CFA_def_cfa_offset 8: ld trims trailing nops.
    writeln!(
        s,
        "\t.fill {nops}, 1, 0\n\t.byte 0x0e, 0x08\n\t.balign 4, 0\ncie_end:"
    )
    .unwrap();
    for i in 0..fdes {
        writeln!(
            s,
            "\t.long 1f - 0f\n0:\t.long 0b - cie\n\t.long .Lcode + {i} - .\n\t.long 1\n\t.uleb128 0\n\t.balign 4, 0\n1:"
        )
        .unwrap();
    }
    s += "\t.section .note.GNU-stack,\"\",@progbits\n";
    let asm = dir.join("crafted_cfi.s");
    std::fs::write(&asm, s).unwrap();
    let status = Command::new("gcc")
        .args(["-shared", "-o"])
        .arg(dir.join("libcrafted_cfi.so"))
        .arg(&asm)
        .status()
        .expect("gcc");
    assert!(status.success(), "assembling the crafted library failed");
    let exe = common::compile_c(
        "crafted_cfi_main.c",
        &[
            "-L",
            dir.to_str().unwrap(),
            "-lcrafted_cfi",
            &format!("-Wl,-rpath,{}", dir.display()),
        ],
    );
    Command::new(exe)
}

#[test]
fn a_crafted_eh_frame_is_refused_and_holds_up_no_other_process_s_tables() {
    common::require_bpf();
    // A 1 MiB .eh_frame: 11.5 billion CIE steps unbounded (11.6 s measured).
    let mut crafted = Proc::spawn(crafted_cfi_workload(512 * 1024, 22_000));
    crafted.expect("ready");
    let exe = common::compile_c(
        "nofp_sites.c",
        &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    let mut w = Proc::spawn(Command::new(exe));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    // The crafted process first: its files are asked for first.
    let mut session = Session::start(
        Target::Pids(vec![Pid(crafted.pid()), Pid(w.pid())]),
        Limits::default(),
    )
    .unwrap();
    // A generous bound (the old code compiled the file for its full cost
    // while every table behind it waited): fail, never hang.
    let deadline = Instant::now() + Duration::from_secs(60);
    while session.unwind_status().loading > 0 {
        assert!(
            Instant::now() < deadline,
            "unwind tables still loading after 60 s: {:?}, {:?}",
            session.unwind_status(),
            session.warnings
        );
        session.poll_events();
        std::thread::sleep(Duration::from_millis(20));
    }
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let whole: f64 = p
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == "main"))
        .map(|s| s.totals.live_bytes)
        .sum();
    assert!(
        whole >= 0.9 * p.totals.live_bytes,
        "{:.1}% of the live heap of the program without frame pointers is under stacks that \
         reach main: {:#?}",
        100.0 * whole / p.totals.live_bytes,
        p.stacks
    );
    let refused: Vec<&String> = session
        .warnings
        .iter()
        .filter(|w| {
            w.contains("libcrafted_cfi.so") && w.contains("call-frame information would take")
        })
        .collect();
    assert_eq!(refused.len(), 1, "reported once: {:?}", session.warnings);
    assert!(
        refused[0].contains("walked by frame pointers"),
        "{}",
        refused[0]
    );
    assert!(session.unwind_status().unavailable >= 1);
    w.send("exit");
    crafted.send("exit");
}

#[test]
fn stacks_cut_short_do_not_keep_their_process_s_maps_read_at_every_refresh() {
    common::require_bpf();
    let mut w = Proc::spawn(nocfi_workload());
    let pid = w.pid();
    common::wait_for_mapping(pid, "libnocfi.so");
    let dir = common::scratch_dir(&format!("rescans-{}", std::process::id()));
    let trace = dir.join("openat.trace");
    // The profiler as users run it, its opens traced (only openat stops it).
    let mut allocprof = Command::new("strace")
        .args(["-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o"])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_allocprof"))
        .args([
            "--pid",
            &pid.to_string(),
            "-d",
            "3s",
            "--interval",
            "100ms",
            "-f",
            "json",
        ])
        .arg("-o")
        .arg(dir.join("profile.json"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("strace counts the profiler's reads of /proc/PID/maps (apt-get install strace)");
    let mut stderr = BufReader::new(allocprof.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        use std::io::BufRead as _;
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "allocprof ended before attaching: {said}"
        );
        said += &line;
        if line.contains("attached") {
            break;
        }
    }
    // Every sample's stack now ends in a truncation marker.
    w.send("go");
    w.expect("ready");
    let status = allocprof.wait().unwrap();
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    assert!(status.success(), "{said}");
    let json = std::fs::read_to_string(dir.join("profile.json")).unwrap();
    assert!(
        json.contains("[truncated: no unwind info for libnocfi.so]"),
        "{json}"
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let reads = text
        .lines()
        .filter(|l| l.contains(&format!("\"/proc/{pid}/")) && l.contains("/maps\""))
        .count();
    // The scans at attach and the first refreshes (5 here); then none: its
    // code did not change and its stacks lie in its maps but for the
    // marker, and the periodic rescan is 5 s away (the old code read them
    // at every refresh: 38 times).
    assert!(
        (1..=10).contains(&reads),
        "/proc/{pid}/maps read {reads} times in 3 s:\n{}",
        text.lines()
            .filter(|l| l.contains("/maps\""))
            .collect::<Vec<_>>()
            .join("\n")
    );
    w.send("exit");
}

/// Whether the stack was cut where it could not be vouched for, having been
/// walked before its process's unwind tables were in.
fn before_tables(s: &StackProfile) -> bool {
    s.frames.last().map(|f| &*f.function) == Some(BEFORE_TABLES_MARKER)
}

#[test]
fn with_pid_a_program_sampling_while_allocprof_attaches_has_whole_stacks_from_the_first() {
    common::require_bpf();
    let exe = common::compile_c(
        "nofp_steady.c",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-pthread",
        ],
    );
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "65536");
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    // Allocating already, and all the while allocprof attaches.
    w.expect("started");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while session
        .refresh()
        .unwrap()
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid)
        .is_none_or(|p| p.alloc_events < 5000)
    {
        assert!(Instant::now() < deadline, "too few samples");
        std::thread::sleep(Duration::from_millis(50));
    }
    w.send("stop");
    w.expect("done");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    // The kernel's walks (not the ledger's seeds from before attach).
    let walked: Vec<&StackProfile> = p
        .stacks
        .iter()
        .filter(|s| s.totals.alloc_samples > 0)
        .collect();
    let samples: u64 = walked.iter().map(|s| s.totals.alloc_samples).sum();
    let all: Vec<(u64, Vec<&str>)> = walked
        .iter()
        .map(|s| (s.totals.alloc_samples, names(s)))
        .collect();
    eprintln!("{samples} samples in {} stacks", walked.len());
    let partial: u64 = walked
        .iter()
        .filter(|s| !holds_chain(&s.frames, &["steady_site", "steady_loop", "main"]))
        .map(|s| s.totals.alloc_samples)
        .sum();
    assert_eq!(
        partial, 0,
        "{partial} of {samples} samples without the whole chain: {all:#?}"
    );
    for s in &walked {
        assert!(
            names(s).iter().all(|n| !n.starts_with('[')),
            "no markers, no unknown frames: {:?}",
            names(s)
        );
    }
    assert_eq!(p.drops[DropReason::StackBeforeTables as usize], 0);
    assert!(walked.len() <= 4, "{all:#?}");
    w.send("exit");
}

/// Runs `nofp_churn.c` built with `flags` as a process that starts after
/// a system-wide session attached and churns at once, before the session
/// even sees it: its first samples come before its unwind tables. Returns
/// its pid and the complete profile.
fn churn_started_after_attach(flags: &[&str]) -> (u32, Profile) {
    let exe = common::compile_c("nofp_churn.c", flags);
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    // As allocprof arms the library's path: covered from its first sample.
    assert!(session.arm(&common::preload_library()).unwrap());
    let mut cmd = Command::new(exe);
    // Every allocation sampled: 400,000 samples of one call site.
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "1");
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    // Killed if the test fails half-way.
    let _w = KillOnDrop(child);
    writeln!(stdin, "go").unwrap();
    // The session runs as allocprof's loop does (events every 20 ms, a
    // profile every second) while the churn runs.
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let line = BufReader::new(stdout).lines().next().and_then(Result::ok);
        let _ = done_tx.send(line);
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last_profile = Instant::now();
    let line = loop {
        session.poll_events();
        if last_profile.elapsed() >= Duration::from_secs(1) {
            session.refresh().unwrap();
            last_profile = Instant::now();
        }
        if let Ok(line) = done.try_recv() {
            break line;
        }
        assert!(Instant::now() < deadline, "the churn did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(line.as_deref(), Some("done"), "the churn failed");
    let profile = session.complete_profile().unwrap();
    writeln!(stdin, "exit").unwrap();
    (pid, profile)
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_process_without_frame_pointers_started_after_attach_has_no_garbage_stacks() {
    common::require_bpf();
    let (pid, profile) = churn_started_after_attach(&["-O2", "-fomit-frame-pointer", "-pthread"]);
    let p = common::process(&profile, pid);
    let all: Vec<(u64, Vec<&str>)> = p
        .stacks
        .iter()
        .map(|s| (s.totals.alloc_samples, names(s)))
        .collect();
    let samples: u64 = p.stacks.iter().map(|s| s.totals.alloc_samples).sum();
    let before: u64 = p
        .stacks
        .iter()
        .filter(|s| before_tables(s))
        .map(|s| s.totals.alloc_samples)
        .sum();
    eprintln!(
        "{samples} samples in {} stacks, {before} before the tables: {all:#?}",
        p.stacks.len()
    );
    assert!(samples >= 390_000, "{samples} samples: {:?}", p.drops);
    // The situation: samples before the process's tables were in.
    assert!(before > 0, "no sample came before the tables: {all:#?}");
    assert_eq!(p.drops[DropReason::StackBeforeTables as usize], before);
    for s in &p.stacks {
        let names = names(s);
        assert!(
            names.iter().all(|n| !n.starts_with("[unknown"))
                && names.iter().rev().skip(1).all(|n| !n.starts_with('[')),
            "garbage, or a marker not last: {names:?}"
        );
    }
    let churn = stacks_of(p, "churn_alloc");
    for s in &churn {
        let names = names(s);
        if before_tables(s) {
            // Cut where it could not be vouched for: the leaf frames.
            assert!(holds_chain(&s.frames, &["churn_alloc"]), "{names:?}");
        } else {
            assert!(
                holds_chain(&s.frames, &["churn_alloc", "worker"])
                    && names.iter().all(|n| !n.starts_with('[')),
                "{names:?}"
            );
        }
    }
    assert!(p.stacks.len() <= 16, "{all:#?}");
    for reason in [DropReason::StackMapFull, DropReason::StackRateLimited] {
        assert_eq!(p.drops[reason as usize], 0, "{reason:?}: {:?}", p.drops);
    }
}

#[test]
fn a_process_with_frame_pointers_started_after_attach_keeps_its_frames() {
    common::require_bpf();
    // compile_c's own flags: -O1 with frame pointers.
    let (pid, profile) = churn_started_after_attach(&["-pthread"]);
    let p = common::process(&profile, pid);
    let all: Vec<(u64, Vec<&str>)> = p
        .stacks
        .iter()
        .map(|s| (s.totals.alloc_samples, names(s)))
        .collect();
    eprintln!("{} stacks: {all:#?}", p.stacks.len());
    for s in &p.stacks {
        let names = names(s);
        assert!(
            names.iter().all(|n| !n.starts_with("[unknown"))
                && names.iter().rev().skip(1).all(|n| !n.starts_with('[')),
            "garbage, or a marker not last: {names:?}"
        );
    }
    let churn = stacks_of(p, "churn_alloc");
    assert!(!churn.is_empty(), "{all:#?}");
    for s in &churn {
        let names = names(s);
        // Every frame of the program is there; a stack walked before the
        // tables ends after the first C library frame (which keeps no
        // frame pointer: its caller cannot be vouched for).
        assert!(
            holds_chain(&s.frames, &["churn_alloc", "worker"])
                && names.iter().all(|n| !n.starts_with("[unknown")),
            "{names:?}"
        );
        if before_tables(s) {
            let worker = names.iter().position(|n| *n == "worker").unwrap();
            assert!(names.len() - worker <= 3, "{names:?}");
        }
    }
    assert!(p.stacks.len() <= 16, "{all:#?}");
}

/// `deep_stack.c` built with `flags`, 200 calls deep, profiled with `limits`.
fn deep_stack(flags: &[&str], limits: Limits) -> (Proc, Profile) {
    let exe = common::compile_c("deep_stack.c", flags);
    let mut cmd = Command::new(exe);
    cmd.arg("200")
        .env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", RATE.to_string());
    let mut w = Proc::spawn(cmd);
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    let mut session = if limits.max_unwind_rows == 0 {
        Session::start(Target::Pids(vec![Pid(w.pid())]), limits).unwrap()
    } else {
        session_with_tables(w.pid(), limits)
    };
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    (w, profile)
}

#[test]
fn stacks_deeper_than_127_frames_end_in_a_marker_and_are_counted() {
    common::require_bpf();
    let nofp = &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"][..];
    let tables_off = Limits {
        max_unwind_rows: 0,
        ..Limits::default()
    };
    for (what, flags, limits) in [
        ("unwind tables, no frame pointers", nofp, Limits::default()),
        ("unwind tables, frame pointers", &[][..], Limits::default()),
        ("frame pointers, tables off", &[][..], tables_off),
    ] {
        let (mut w, profile) = deep_stack(flags, limits);
        let p = common::process(&profile, w.pid());
        let stacks = stacks_of(p, "deep_alloc");
        assert!(!stacks.is_empty(), "{what}: {p:#?}");
        for s in &stacks {
            let names = names(s);
            assert_eq!(
                names.last().copied(),
                Some(DEPTH_CUT_MARKER),
                "{what}: {names:?}"
            );
            // 126 frames and the marker: the innermost ones (the
            // allocator's are stripped).
            let deep = names.iter().filter(|n| **n == "deep").count();
            assert!((115..=125).contains(&deep), "{what}: {deep} deep frames");
        }
        let samples: u64 = stacks.iter().map(|s| s.totals.alloc_samples).sum();
        assert_eq!(
            p.drops[DropReason::StackTooDeep as usize],
            samples,
            "{what}: every sample counted"
        );
        assert!(samples > 0);
        let (truth, sigma) = common::truth_and_sigma(256, 64 << 10, RATE);
        let live: f64 = stacks.iter().map(|s| s.totals.live_bytes).sum();
        assert!(
            (live - truth).abs() <= 5.0 * sigma,
            "{what}: {live} vs {truth}"
        );
        w.send("exit");
    }
}
