//! Leaks by age, with real eBPF and a real process: a true leak beside a
//! larger churning cache. By live bytes the cache ranks first; counting
//! only what has been live for 5 s (`--min-age 5s`), the leak does, with
//! its bytes within σ bounds.

mod common;

use std::{process::Command, time::Duration};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::age::OLD,
    model::profile::{ProcessProfile, StackProfile},
    session::{Session, Target},
};
use common::{Proc, RATE};

/// `LEAK_N` and `LEAK_SIZE` of age_leak.c.
const LEAK_N: u64 = 200;
const LEAK_SIZE: u64 = 65536;

fn top(p: &ProcessProfile) -> &StackProfile {
    &p.stacks[0]
}

fn holds(s: &StackProfile, function: &str) -> bool {
    s.frames.iter().any(|f| &*f.function == function)
}

#[test]
fn with_a_minimum_age_a_leak_ranks_above_a_larger_churning_cache() {
    common::require_bpf();
    let exe = common::compile_c("age_leak.c", &["-pthread"]);
    let mut w = Proc::spawn(Command::new(exe));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    // Every cache slot is replaced about twice a second: after 7 s, no
    // cache block is 5 s old, every leaked one is.
    std::thread::sleep(Duration::from_secs(7));

    let all = session.complete_profile().unwrap();
    let p = common::process(&all, w.pid());
    assert!(
        holds(top(p), "cache_site"),
        "by live bytes the cache is larger"
    );
    let leak = p.stacks.iter().find(|s| holds(s, "leak_site")).unwrap();
    assert!(leak.totals.ages.oldest >= Duration::from_secs(7));
    assert!(leak.totals.ages.oldest < OLD);

    session.set_min_age(Duration::from_secs(5));
    let old = session.complete_profile().unwrap();
    let p = common::process(&old, w.pid());
    assert!(holds(top(p), "leak_site"), "{:#?}", p.stacks);
    let (truth, sigma) = common::truth_and_sigma(LEAK_N, LEAK_SIZE, RATE);
    let live = top(p).totals.live_bytes;
    assert!(
        (live - truth).abs() <= 4.0 * sigma,
        "leak {live} vs {truth} (sigma {sigma})"
    );
    let cache: f64 = p
        .stacks
        .iter()
        .filter(|s| holds(s, "cache_site"))
        .map(|s| s.totals.live_bytes)
        .sum();
    assert!(
        cache < live / 4.0,
        "the cache's blocks are younger than 5 s: {cache}"
    );
    w.send("exit");
}
