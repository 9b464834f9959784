//! The heap next to resident memory, with real eBPF and a real process
//! whose heap is fragmented (many blocks, every other one freed): its
//! anonymous memory stays well above the live heap, and the figures
//! allocprof reports are those of `/proc/PID/status`.

mod common;

use std::process::Command;

use allocprof::{
    discover::parse_resident,
    kernel::Limits,
    report::{self, ReportOptions},
    session::{Session, Target},
};
use common::{Proc, RATE};

/// `N / 2` blocks of `SIZE` of fragment.c stay live.
const LIVE_BLOCKS: u64 = 10_000;
const SIZE: u64 = 4096;

#[test]
fn a_fragmented_heap_shows_resident_memory_well_above_the_live_heap() {
    common::require_bpf();
    let exe = common::compile_c("fragment.c", &[]);
    let mut w = Proc::spawn(Command::new(exe));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![w.pid()]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.pid())).unwrap();
    let truth = parse_resident(&status).unwrap();

    let p = common::process(&profile, w.pid());
    let (heap, sigma) = common::truth_and_sigma(LIVE_BLOCKS, SIZE, RATE);
    assert!(
        (p.totals.live_bytes - heap).abs() <= 4.0 * sigma,
        "live heap {} vs {heap}",
        p.totals.live_bytes
    );
    let r = p.resident.expect("a running process's resident memory");
    // Read moments apart from a process that no longer allocates.
    let close = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 0.05 * b as f64 + 65536.0;
    assert!(close(r.anon, truth.anon), "{r:?} vs /proc {truth:?}");
    assert!(close(r.file, truth.file), "{r:?} vs /proc {truth:?}");
    assert!(
        r.anon as f64 >= 1.6 * p.totals.live_bytes,
        "the freed half stays resident: anonymous {} vs heap {}",
        r.anon,
        p.totals.live_bytes
    );
    let text = report::render(&profile, ReportOptions::default());
    assert!(
        text.contains("of anonymous memory is not live heap"),
        "{text}"
    );
    w.send("exit");
}
