//! Back-pressure (`--max-event-rate`) with real eBPF and a real process far
//! above the budget: the kernel keeps about the budget's worth of sampled
//! allocations a second, and the kept ones, scaled, still estimate each
//! site within its (wider) σ bounds, huge blocks under a huge factor too.

mod common;

use std::process::Command;

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::{profile::ProcessProfile, stats::Z95},
    output::report::{self, ReportOptions},
    session::{Session, Target},
};
use common::Proc;
use profiler_common::WeightForm;

const BUDGET: u64 = 2000;
/// Small, so the workload samples hundreds of thousands of allocations a
/// second: 22% of the 256-byte ones, 39% of the 512-byte ones.
const RATE: u64 = 1024;

#[test]
fn under_a_budget_far_below_the_event_rate_estimates_stay_within_sigma() {
    common::require_bpf();
    let exe = common::compile_c("budget_sites.c", &[]);
    let mut cmd = Command::new(exe);
    cmd.arg("3")
        .env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", RATE.to_string());
    let mut w = Proc::spawn(cmd);
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    let limits = Limits {
        max_event_rate: BUDGET,
        ..Limits::default()
    };
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), limits).unwrap();
    let (churned, kept_blocks, seconds) = churn_until_ready(&mut w);
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());

    // Far above the budget: most events thinned, the kept ones near it.
    let events = p.alloc_events as f64;
    let walked = (p.alloc_events - p.thinned_events) as f64;
    let what = format!(
        "{events} sampled allocations in {seconds:.2} s, {walked} walked, factor {}",
        p.thin_factor
    );
    eprintln!("{what}");
    assert!(events > 20.0 * BUDGET as f64 * seconds, "{what}");
    assert!(p.thin_factor > 1, "{what}");
    // A window's allowance is BUDGET / 10; the first windows ramp up.
    let allowance = BUDGET as f64 / 10.0;
    assert!(
        walked <= 1.5 * BUDGET as f64 * seconds + 10.0 * allowance,
        "{what}"
    );
    assert!(walked >= 0.25 * BUDGET as f64 * seconds, "{what}");

    // Nothing churned stays live; frees of unkept blocks are no drops.
    sites_within_4_sigma(p, kept_blocks * 512.0, churned * 256.0, &what);
    let text = report::render(&profile, ReportOptions::default());
    assert!(text.contains("back-pressure (--max-event-rate)"), "{text}");
    w.send("exit");
}

/// heavy_thinned.c's light flood (alloc and free pairs) and its live 4 GiB
/// samples.
const LIGHT: u64 = 200_000;
const HEAVY: u64 = 16_384;
const HEAVY_SIZE: f64 = (4u64 << 30) as f64;

/// Issue 26: a sample kept 1 in `factor` counts `factor × weight`, which
/// was clamped at 2^40 without a mark: under a factor in the thousands a
/// 4 GiB sample counted 1 TiB where it stood for several, and the live
/// figure showed a fraction of the truth with a narrow interval. A heavy
/// event is now thinned by a lower factor (`thin_factor_for`), so its sums
/// are exact: at 4 GiB, by none.
#[test]
fn huge_samples_under_a_huge_thin_factor_are_counted_in_full() {
    common::require_bpf();
    let include = format!("-I{}", common::workspace_root().join("contrib").display());
    let exe = common::compile_c("heavy_thinned.c", &[include.as_str()]);
    let mut cmd = Command::new(exe);
    cmd.args([LIGHT, HEAVY].map(|n| n.to_string()))
        .env("LD_PRELOAD", "");
    let mut w = Proc::spawn(cmd);
    w.expect("ready");
    // 1 event kept per 100 ms window: the factor follows the event rate.
    let limits = Limits {
        max_event_rate: 10,
        ..Limits::default()
    };
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), limits).unwrap();
    w.send("go");
    w.expect("done");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let heavy = common::site(p, "site_heavy");
    let truth = HEAVY as f64 * HEAVY_SIZE;
    let what = format!(
        "{} events, {} thinned, factor {}; {HEAVY} live 4 GiB blocks: {} TiB ± {} \
         (95%) from {} samples, truth {} TiB",
        p.alloc_events,
        p.thinned_events,
        p.thin_factor,
        heavy.live_bytes / 2f64.powi(40),
        heavy.live_ci95() / 2f64.powi(40),
        heavy.live_samples,
        truth / 2f64.powi(40),
    );
    eprintln!("{what}");
    // The case: a factor at which 4 GiB × factor passes 2^40 many times.
    assert!(p.thin_factor >= 1024, "too little back-pressure: {what}");
    assert_eq!(p.alloc_events, LIGHT + HEAVY, "{what}");
    assert_eq!(
        p.weight_form,
        WeightForm::PointsTimesInterval { interval: 65_536 },
        "{what}"
    );
    // 4 GiB × any factor > 1 is past the largest thinned weight: each
    // heavy event kept.
    assert_eq!(heavy.live_samples, HEAVY, "{what}");
    // Within 4σ of the truth, σ from the interval the profile shows: an
    // unmarked clamp leaves the estimate a fraction of the truth, dozens
    // of σ away.
    for (name, estimate, ci95) in [
        ("live", heavy.live_bytes, heavy.live_ci95()),
        ("allocated", heavy.alloc_bytes, heavy.alloc_ci95()),
    ] {
        let sigma = ci95 / Z95;
        assert!(
            (estimate - truth).abs() <= 4.0 * sigma,
            "{name}: {estimate} vs {truth} (σ {sigma}): {what}"
        );
    }
    assert_eq!(p.lost_live_bytes, 0, "{what}");
    w.send("exit");
}

/// The allocator's own budget (`ALLOCPROF_MAX_EVENT_RATE`), at the default
/// settings (neither variable set): a process sampling far more than the
/// default budget keeps about the budget's worth a second, before the
/// probe; allocprof reports the allocator's thinning next to the figures it
/// widens; and the kept samples, each counted k times, estimate each site
/// within 4σ of the truth the program counted.
#[test]
fn the_allocators_default_budget_keeps_a_busy_process_near_it_unbiased() {
    const DEFAULT_BUDGET: f64 = allocator::budget::DEFAULT_MAX_EVENT_RATE as f64;
    // At the default rate (512 KiB), 12% of the 64 KiB blocks are sampled:
    // hundreds of thousands a second. One size at both sites: every kept
    // weight is then k·w of one w, which must not be read as `nsamples × R`
    // (whose variance, R·bytes with R the smallest k·w, would understate
    // the samples of a larger k).
    const CHURN: u64 = 64 << 10;
    const KEEP: u64 = 64 << 10;
    common::require_bpf();
    let exe = common::compile_c("budget_sites.c", &[]);
    let mut cmd = Command::new(exe);
    cmd.args(["3", &CHURN.to_string(), &KEEP.to_string()])
        .env("LD_PRELOAD", common::preload_library())
        .env_remove("ALLOCPROF_RATE")
        .env_remove("ALLOCPROF_MAX_EVENT_RATE");
    let mut w = Proc::spawn(cmd);
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    // No kernel back-pressure: all thinning is the allocator's.
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    let (churned, kept_blocks, seconds) = churn_until_ready(&mut w);
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let t = p
        .alloc_thinning
        .expect("the library's statistics block has the budget's words");
    let seen = p.alloc_events as f64;
    let what = format!(
        "{churned} churned, {kept_blocks} kept in {seconds:.2} s: {seen} sampled allocations \
         seen, {} dropped by the allocator (factor {}, budget {:?}), {} by the kernel",
        t.thinned, t.factor, t.max_event_rate, p.thinned_events
    );
    eprintln!("{what}");
    assert_eq!(t.max_event_rate, Some(DEFAULT_BUDGET as u64), "{what}");
    assert_eq!(p.thinned_events, 0, "{what}");
    assert_eq!(p.weight_form, WeightForm::InverseProbability, "{what}");
    // Far above the budget: most samples dropped before the probe.
    assert!(t.factor >= 4, "{what}");
    assert!(t.thinned as f64 > 10.0 * DEFAULT_BUDGET * seconds, "{what}");
    // What reached the probe: near the budget a second (between half of it
    // and it in steady state, powers of two; the first windows ramp up).
    let allowance = DEFAULT_BUDGET / 10.0;
    assert!(
        seen <= 1.5 * DEFAULT_BUDGET * seconds + 10.0 * allowance,
        "{what}"
    );
    assert!(seen >= 0.25 * DEFAULT_BUDGET * seconds, "{what}");

    // The kept samples count for the dropped ones (w' = k·w), and a
    // dropped sample fires no free probe either.
    sites_within_4_sigma(p, kept_blocks * KEEP as f64, churned * CHURN as f64, &what);
    // Said next to the figures it widens.
    let text = report::render(&profile, ReportOptions::default());
    assert!(text.contains("the allocator's sample budget"), "{text}");
    assert!(text.contains(report::THIN_MARK), "{text}");
    assert!(p.thinned(), "{what}");
    w.send("exit");
}

/// budget_sites.c's sites within 4σ of the program's truth (`kept` bytes
/// live at keep_site, `churned` bytes allocated at churn_site and none
/// live), σ from the interval the profile reports (which includes the
/// thinning); no free unmatched (a thinned sample fires no free probe).
fn sites_within_4_sigma(p: &ProcessProfile, kept: f64, churned: f64, what: &str) {
    let within = |est: f64, ci95: f64, truth: f64, name: &str| {
        let sigma = ci95 / Z95;
        assert!(
            sigma > 0.0 && (est - truth).abs() <= 4.0 * sigma,
            "{name}: {est} vs {truth} (σ {sigma}); {what}"
        );
    };
    let keep = common::site(p, "keep_site");
    within(keep.live_bytes, keep.live_ci95(), kept, "keep_site live");
    let churn = common::site(p, "churn_site");
    within(
        churn.alloc_bytes,
        churn.alloc_ci95(),
        churned,
        "churn_site allocated",
    );
    within(
        churn.live_bytes,
        churn.live_ci95().max(1.0),
        0.0,
        "churn_site live",
    );
    assert_eq!(
        p.drops[profiler_common::DropReason::UnmatchedFree as usize],
        0,
        "{what}"
    );
}

/// Starts budget_sites.c's churn and waits for its `ready CHURNED KEPT
/// SECONDS` line.
fn churn_until_ready(w: &mut Proc) -> (f64, f64, f64) {
    w.send("go");
    let line = w.line();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"ready"), "{line}");
    let field = |i: usize| -> f64 { fields[i].parse().unwrap() };
    (field(1), field(2), field(3))
}

/// A Rust program with the global allocator (`SamplingAllocator<System>`):
/// the system allocator keeps no figures for the block to show, but the
/// block's budget words are there all the same, so the program's thinning
/// is read and said next to the figures it widens.
#[test]
fn a_rust_programs_budget_is_read_though_its_allocator_keeps_no_figures() {
    const BUDGET: u64 = 50;
    common::require_bpf();
    let mut cmd = Command::new(common::example("rust_sites"));
    // Its own allocator: nothing preloaded.
    cmd.env("LD_PRELOAD", "")
        .env("ALLOCPROF_RATE", common::RATE.to_string())
        .env("ALLOCPROF_MAX_EVENT_RATE", BUDGET.to_string());
    let mut w = Proc::spawn(cmd);
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    // About a thousand samples in a few milliseconds, at 5 a window.
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let t = p
        .alloc_thinning
        .expect("the allocator's budget words are read");
    let what = format!(
        "{} sampled allocations seen, {} dropped by the allocator (factor {}, budget {:?})",
        p.alloc_events, t.thinned, t.factor, t.max_event_rate
    );
    eprintln!("{what}");
    assert_eq!(t.max_event_rate, Some(BUDGET), "{what}");
    assert!(t.thinned > 0 && t.factor > 1, "{what}");
    assert_eq!(
        p.backend_heap, None,
        "the system allocator gives no figures"
    );
    assert!(p.thinned(), "{what}");
    let text = report::render(&profile, ReportOptions::default());
    assert!(text.contains("the allocator's sample budget"), "{text}");
    assert!(text.contains(report::THIN_MARK), "{text}");
    w.send("exit");
}
