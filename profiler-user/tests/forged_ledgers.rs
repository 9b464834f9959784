//! A process's live-sample ledger is in its own memory: a process may
//! forge it, with as many records as allocprof reads, each on a stack of
//! its own, of any size and weight. What allocprof makes of a ledger obeys
//! the caps the kernel puts on live samples (per process, and for the
//! session), its memory stays bounded, what is dropped is counted, and a
//! weight the kernel would refuse leaves no interval. Real eBPF, real
//! processes under liballocprof.so that forge their ledgers, and an honest
//! one beside them. (Alone in its test binary: the test measures the peak
//! memory of its own process, where the session runs.)

mod common;

use std::process::Command;

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    output::report::{self, ReportOptions},
    process::ledger::MAX_RECORDS,
    session::{Session, Target},
};
use common::{Proc, RATE, header_address, read_words, truth_and_sigma, write_words};
use profiler_common::{
    DropReason, MAX_WEIGHT,
    ledger::{FLAG_LIVE, FRAMES, HEADER_WORDS, RECORD_WORDS, header, record},
};

/// A process under liballocprof.so whose ledger header now names a table of
/// `n` live records of `size` bytes and `weight`, each on its own stack.
fn forger(n: u64, size: u64, weight: u64) -> Proc {
    let layout = [
        RECORD_WORDS,
        record::SEQ,
        record::PTR,
        record::SIZE,
        record::WEIGHT,
        record::TIME_NS,
        record::FLAGS,
        record::NFRAMES,
        record::FRAMES,
        FRAMES,
        FLAG_LIVE as usize,
    ];
    let mut cmd = Command::new(common::compile_c("forged_ledger.c", &[]));
    cmd.args(layout.iter().map(usize::to_string));
    let mut w = Proc::spawn(cmd);
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    // Blocks "in" a sample region of 64 TiB starting at 16 TiB.
    let base: u64 = 1 << 44;
    w.send(&format!("table {n} {size} {weight} {base:x}"));
    let line = w.line();
    let table = line
        .strip_prefix("table ")
        .and_then(|t| u64::from_str_radix(t, 16).ok())
        .unwrap_or_else(|| panic!("unexpected {line:?}"));
    let at = header_address(w.pid());
    let mut h = read_words(w.pid(), at, HEADER_WORDS);
    h[header::TABLE] = table;
    h[header::CAPACITY] = n;
    h[header::REGION_BASE] = base;
    h[header::REGION_LEN] = 1 << 46;
    h[header::RANGES] = 1;
    h[header::FIRST] = 0;
    h[header::USED] = n;
    write_words(w.pid(), at, &h);
    w
}

fn vm_hwm_kib() -> u64 {
    common::memory_kib(std::process::id(), "VmHWM")
}

#[test]
fn forged_ledgers_are_held_to_the_kernels_caps_and_memory_stays_bounded() {
    common::require_bpf();
    let before = vm_hwm_kib();
    // Three forgers, as many records as allocprof reads: all weights equal
    // to their size (p = 1: "exact"), weights the kernel refuses (2^40),
    // and small blocks of large weight.
    let exact = forger(MAX_RECORDS, 512 << 10, 512 << 10);
    let invalid = forger(MAX_RECORDS, 1 << 20, MAX_WEIGHT);
    let heavy = forger(MAX_RECORDS, 4096, 512 << 10);
    // An honest process beside them (heap_before.c's site_a and site_b).
    let mut honest = Proc::spawn(Command::new(common::compile_c(
        "heap_before.c",
        &["-pthread"],
    )));
    common::wait_for_mapping(honest.pid(), "liballocprof.so");
    honest.send("alloc");
    honest.expect("ready");

    let limits = Limits::default();
    let forgers = [exact.pid(), invalid.pid(), heavy.pid()];
    let mut pids = forgers.to_vec();
    pids.push(honest.pid());
    let mut session =
        Session::start(Target::Pids(pids.iter().map(|&p| Pid(p)).collect()), limits).unwrap();
    let profile = session.complete_profile().unwrap();
    let after = vm_hwm_kib();

    for pid in forgers {
        let p = common::process(&profile, pid);
        let ledger = p.ledger.expect("its ledger was read");
        // Per process: at most the kernel's cap of live samples, at most
        // its burst of new stacks (past it, the overflow stack); the rest
        // counted as dropped, their bytes as lost (a lower bound).
        assert!(ledger.read, "{ledger:?}");
        assert!(
            ledger.seeded <= limits.max_live_per_process,
            "{ledger:?} in {pid}"
        );
        assert_eq!(
            ledger.seeded + ledger.dropped,
            MAX_RECORDS,
            "every record seeded or dropped: {ledger:?}"
        );
        assert!(
            p.drops[DropReason::ProcessCap as usize] >= MAX_RECORDS - limits.max_live_per_process,
            "{:?}",
            p.drops
        );
        assert!(
            p.drops[DropReason::StackRateLimited as usize] > 0,
            "{:?}",
            p.drops
        );
        assert!(p.lost_live_bytes > 0);
        assert!(
            p.stacks.len() as u64 <= limits.new_stacks_burst + 2,
            "{} stacks",
            p.stacks.len()
        );
    }
    // Weights the kernel would refuse: no interval. Equal weights: not
    // "exact" either (they are what `nsamples × R` weights look like).
    let exact_p = common::process(&profile, exact.pid());
    assert!(exact_p.totals.live_ci95() > 0.0, "{:?}", exact_p.totals);
    let invalid_p = common::process(&profile, invalid.pid());
    assert!(
        invalid_p.totals.live_ci95().is_nan(),
        "{:?}",
        invalid_p.totals
    );

    // The honest process is profiled as ever.
    let h = common::process(&profile, honest.pid());
    for (site, (n, size)) in [("site_a", (4000, 4096)), ("site_b", (200, 65536))] {
        let t = common::site(h, site);
        let (truth, sigma) = truth_and_sigma(n, size, RATE);
        assert!(
            (t.live_bytes - truth).abs() <= 5.0 * sigma,
            "{site}: {} vs {truth} ± {sigma}",
            t.live_bytes
        );
    }
    assert_eq!(h.lost_live_bytes, 0);

    // Shown: the drops and the lower bound.
    let text = report::render(&profile, ReportOptions::default());
    assert!(text.contains(DropReason::ProcessCap.describe()), "{text}");
    assert!(text.contains("lower bound"), "{text}");

    // Three forged ledgers took 745-933 MiB before they were capped.
    let grown_mib = after.saturating_sub(before) / 1024;
    eprintln!("VmHWM {before} KiB before, {after} KiB after the session's first profile");
    assert!(
        grown_mib < 200,
        "the session's peak memory grew by {grown_mib} MiB"
    );
}
