//! Walks that end early end in one honest marker, counted: code without call-frame information, a signal frame, a stack past 127 frames; and such stacks force no rescans.

use super::*;

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
