//! Whole stacks in code built without frame pointers: the kernel walks them
//! with the unwind tables allocprof compiled from the files' call-frame
//! information. Real kernel programs, a real C program built -O2 without
//! frame pointers, real samples.

mod common;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use allocprof::{
    kernel::Limits,
    profile::{ProcessProfile, StackProfile},
    session::{Session, Target},
    symbolize::Frame,
};
use common::{Proc, RATE};

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

/// Whether `frames` (innermost first) hold `chain` in that order.
fn holds_chain(frames: &[Frame], chain: &[&str]) -> bool {
    let mut want = chain.iter().peekable();
    for f in frames {
        if want.peek().is_some_and(|w| f.function == **w) {
            want.next();
        }
    }
    want.peek().is_none()
}

fn stacks_of<'a>(p: &'a ProcessProfile, function: &str) -> Vec<&'a StackProfile> {
    p.stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.function == function))
        .collect()
}

#[test]
fn stacks_without_frame_pointers_are_whole_and_estimates_unbiased() {
    common::require_bpf();
    let exe = common::compile_c(
        "nofp_sites.c",
        &["-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls"],
    );
    let mut w = Proc::spawn(Command::new(exe));
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![pid]), Limits::default()).unwrap();
    // The tables of its files are built and loaded before it allocates.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        session.poll_events();
        let status = session.unwind_status();
        if status.loading == 0 && status.ready > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "unwind tables not loaded: {status:?}, {:?}",
            session.warnings
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);

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
        .map(|s| s.frames.iter().filter(|f| f.function == "recurse").count())
        .max()
        .unwrap();
    assert_eq!(deepest, 101, "the whole 100-deep recursion is walked");
    // One site, one stack: no garbage frames make each sample its own.
    assert!(
        stacks_of(p, "site_one_level").len() <= 2,
        "{:#?}",
        stacks_of(p, "site_one_level")
    );
    w.send("exit");
}

#[test]
fn a_library_without_call_frame_information_ends_its_stacks_in_one_marker() {
    common::require_bpf();
    let dir = common::scratch_dir(&format!("nocfi-{}", std::process::id()));
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
    let mut w = Proc::spawn(Command::new(exe));
    let pid = w.pid();
    common::wait_for_mapping(pid, "libnocfi.so");
    let mut session = Session::start(Target::Pids(vec![pid]), Limits::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while session.unwind_status().loading > 0 || session.unwind_status().ready == 0 {
        assert!(Instant::now() < deadline, "{:?}", session.unwind_status());
        session.poll_events();
        std::thread::sleep(Duration::from_millis(20));
    }
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    let stacks = stacks_of(p, "nocfi_alloc");
    assert!(!stacks.is_empty(), "{p:#?}");
    for s in &stacks {
        let names: Vec<&str> = s.frames.iter().map(|f| f.function.as_str()).collect();
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
    let live: f64 = stacks.iter().map(|s| s.totals.live_bytes).sum();
    let (truth, sigma) = common::truth_and_sigma(1000, 8192, RATE);
    assert!((live - truth).abs() <= 5.0 * sigma, "{live} vs {truth}");
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
    let mut cmd = Command::new("python3");
    cmd.args(["-c", script]).env("PYTHONMALLOC", "malloc");
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![pid]), Limits::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while session.unwind_status().loading > 0 || session.unwind_status().ready == 0 {
        assert!(Instant::now() < deadline, "{:?}", session.unwind_status());
        session.poll_events();
        std::thread::sleep(Duration::from_millis(20));
    }
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    let reaches_main = |s: &&StackProfile| {
        s.frames
            .iter()
            .any(|f| f.function.starts_with("__libc_start_main") || f.function == "Py_BytesMain")
    };
    let whole: f64 = p
        .stacks
        .iter()
        .filter(reaches_main)
        .map(|s| s.totals.live_bytes)
        .sum();
    let live = p.totals.live_bytes;
    assert!(
        whole >= 0.99 * live,
        "{:.1} % of {live} live bytes on stacks that reach main: {:#?}",
        100.0 * whole / live,
        p.stacks
            .iter()
            .map(|s| s
                .frames
                .iter()
                .map(|f| f.function.as_str())
                .collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    let (truth, sigma) = common::truth_and_sigma(1024, 65536, RATE);
    assert!(
        (live - truth).abs() <= 5.0 * sigma + 4.0 * 1_048_576.0,
        "live {live} vs about {truth}"
    );
    w.send("exit");
}
