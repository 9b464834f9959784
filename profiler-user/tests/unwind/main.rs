//! Whole stacks in code built without frame pointers: the kernel walks them
//! with the unwind tables allocprof compiled from the files' call-frame
//! information. Real kernel programs, a real C program built -O2 without
//! frame pointers, real samples.

mod cut_short;
mod hostile;
mod new_processes;
mod real_programs;

#[path = "../common/mod.rs"]
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

fn names(s: &StackProfile) -> Vec<&str> {
    s.frames.iter().map(|f| &*f.function).collect()
}
