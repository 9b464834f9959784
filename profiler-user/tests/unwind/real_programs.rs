//! Real programs without frame pointers: Debian's python3, C++ through libstdc++, a Rust program.

use super::*;

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
