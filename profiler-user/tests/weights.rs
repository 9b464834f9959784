//! Emitters other than allocprof's allocator (issue 13): C programs with
//! their own per-byte sampler firing `ddheap` and `otel_memory` probes with
//! register arguments (`<sys/sdt.h>`, or contrib/allocprof_probes.h), with
//! `nsamples × R` or `size / p` weights, or nonsense ones. Per-site
//! estimates within 4σ of the truth, 95% intervals that cover it in at
//! least 90% of 20 runs per weight form, the contract each process spoke,
//! and unavailable intervals where the weights fit no known form. The
//! emitters' seeds are fixed, so the statistics are reproducible.

mod common;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::{ProcessProfile, Profile},
    session::{Session, Target},
};
use common::{Proc, process, site};
use profiler_common::WeightForm;

/// weighted_sites.c's R.
const RATE: u64 = 65_536;
/// weighted_sites.c's sites: (function, count, size, freed).
const SITES: [(&str, u64, u64, bool); 4] = [
    ("site_small", 20_000, 64, false),
    ("site_medium", 2_000, 3_000, false),
    ("site_large", 40, 200_000, false),
    ("site_freed", 10_000, 512, true),
];
const RUNS: u64 = 20;

fn emitter(extra: &[&str]) -> PathBuf {
    let mut args = extra.to_vec();
    args.push("-lm");
    common::compile_c("weighted_sites.c", &args)
}

fn kit_emitter(provider: Option<&str>) -> PathBuf {
    let include = format!("-I{}", common::workspace_root().join("contrib").display());
    let define = provider.map(|p| format!("-DALLOCPROF_PROBES_PROVIDER=\"{p}\""));
    let mut args = vec!["-DUSE_KIT", include.as_str()];
    if let Some(d) = &define {
        args.push(d);
    }
    emitter(&args)
}

/// Runs one emitter per (form, provider, seed) under one session, and the
/// profile once all are done (they stay alive until it is taken).
fn profile_of(exe: &Path, runs: &[(&str, &str, u64)]) -> (Profile, Vec<u32>) {
    let runs: Vec<_> = runs.iter().map(|&(f, p, s)| (exe, f, p, s)).collect();
    profile_of_each(&runs)
}

/// As [`profile_of`], each run with its own executable.
fn profile_of_each(runs: &[(&Path, &str, &str, u64)]) -> (Profile, Vec<u32>) {
    common::require_bpf();
    let mut procs: Vec<Proc> = runs
        .iter()
        .map(|(exe, form, provider, seed)| {
            let mut cmd = Command::new(exe);
            cmd.args([*form, *provider])
                .arg(OsString::from(seed.to_string()))
                .env("LD_PRELOAD", "");
            let mut p = Proc::spawn(cmd);
            p.expect("ready");
            p
        })
        .collect();
    let pids: Vec<u32> = procs.iter().map(Proc::pid).collect();
    // System-wide: one attachment per probe site for all the runs. Per-pid
    // attachments (20 runs × 4 sites) take ~0.1 s each to detach.
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    // Every run is attached before it fires.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pids.iter().all(|&pid| session.is_attached_to(Pid(pid))) {
        assert!(Instant::now() < deadline, "a run was never attached");
        session.poll_events();
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in &mut procs {
        p.send("go");
    }
    for p in &mut procs {
        p.expect("done");
    }
    let profile = session.complete_profile().unwrap();
    drop(procs);
    (profile, pids)
}

/// Truth and standard deviation of one site's allocated bytes under a
/// weight form: `nsamples × R` has variance R·size per allocation; `size / p`
/// has size²(1 − p)/p.
fn truth_and_sigma(form: &str, n: u64, size: u64) -> (f64, f64) {
    let (n, s, r) = (n as f64, size as f64, RATE as f64);
    let per_alloc = match form {
        "points" => r * s,
        _ => {
            let p = -(-s / r).exp_m1();
            s * s * (1.0 - p) / p
        }
    };
    (n * s, (n * per_alloc).sqrt())
}

/// Every site within 4σ; returns (intervals covering the truth, intervals).
fn check_sites(p: &ProcessProfile, form: &str) -> (u32, u32) {
    let (mut covered, mut intervals) = (0, 0);
    for (function, n, size, freed) in SITES {
        let t = site(p, function);
        let (truth, sigma) = truth_and_sigma(form, n, size);
        assert!(t.alloc_samples > 0, "{function}: no samples in {p:#?}");
        let mut check = |estimate: f64, ci: f64, what: &str| {
            assert!(
                (estimate - truth).abs() <= 4.0 * sigma,
                "{form} {function} {what}: {estimate} vs truth {truth} (sigma {sigma})"
            );
            assert!(!ci.is_nan(), "{form} {function}: an interval is available");
            intervals += 1;
            covered += u32::from((estimate - truth).abs() <= ci);
        };
        check(t.alloc_bytes, t.alloc_ci95(), "allocated");
        if freed {
            assert_eq!(t.live_bytes, 0.0, "{function}: freed memory is not live");
        } else {
            check(t.live_bytes, t.live_ci95(), "live");
        }
    }
    (covered, intervals)
}

fn assert_coverage(form: &str, covered: u32, intervals: u32) {
    let share = f64::from(covered) / f64::from(intervals);
    eprintln!("{form}: 95% intervals covered the truth {covered}/{intervals} ({share:.3})");
    assert!(share >= 0.90, "{form}: coverage {covered}/{intervals}");
}

#[test]
fn points_times_interval_weights_from_sdt_emitters_of_both_providers() {
    let exe = emitter(&[]);
    // Both providers' sites are found, with register arguments.
    let (sites, problems) = allocprof::process::discover::probe_sites(&exe).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let mut providers: Vec<u32> = sites.iter().map(|s| s.spec.provider).collect();
    providers.sort_unstable();
    assert_eq!(
        providers,
        [
            profiler_common::CONTRACT_OTEL_MEMORY,
            profiler_common::CONTRACT_OTEL_MEMORY,
            profiler_common::CONTRACT_DDHEAP,
            profiler_common::CONTRACT_DDHEAP
        ]
    );
    assert!(
        sites
            .iter()
            .all(|s| s.spec.args[0].kind == profiler_common::UsdtArgKind::Reg as u8)
    );
    let runs: Vec<_> = (1..=RUNS)
        .map(|seed| {
            (
                "points",
                if seed % 2 == 0 { "ddheap" } else { "otel" },
                seed,
            )
        })
        .collect();
    let (profile, pids) = profile_of(&exe, &runs);
    let (mut covered, mut intervals) = (0, 0);
    for (pid, (_, provider, _)) in pids.iter().zip(&runs) {
        let p = process(&profile, *pid);
        let want = if *provider == "ddheap" {
            "ddheap"
        } else {
            "otel_memory"
        };
        assert_eq!(p.contract(), want);
        assert_eq!(
            p.weight_form,
            WeightForm::PointsTimesInterval { interval: RATE },
            "{p:#?}"
        );
        let (c, n) = check_sites(p, "points");
        covered += c;
        intervals += n;
    }
    assert_coverage("nsamples × R", covered, intervals);
}

#[test]
fn inverse_probability_weights_from_an_emitter_of_both_providers_at_once() {
    let exe = emitter(&[]);
    let runs: Vec<_> = (101..101 + RUNS)
        .map(|seed| ("inverse", "both", seed))
        .collect();
    let (profile, pids) = profile_of(&exe, &runs);
    let (mut covered, mut intervals) = (0, 0);
    for pid in &pids {
        let p = process(&profile, *pid);
        assert_eq!(p.contract(), "otel_memory+ddheap");
        assert_eq!(p.weight_form, WeightForm::InverseProbability);
        let (c, n) = check_sites(p, "inverse");
        covered += c;
        intervals += n;
    }
    assert_coverage("size / p", covered, intervals);
    // The JSON says both, and the weight form.
    let json: serde_json::Value =
        serde_json::from_slice(&allocprof::output::export::json::render(&profile)).unwrap();
    // System-wide: the other tests' emitters may be in the profile too.
    let first = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pids[0])
        .unwrap();
    assert_eq!(
        first["contracts"],
        serde_json::json!(["otel_memory", "ddheap"])
    );
    assert_eq!(first["weight_form"], "inverse_probability");
    assert!(first["totals"]["live_bytes_ci95"].is_number());
}

#[test]
fn nonsense_weights_mark_the_intervals_unavailable() {
    let exe = emitter(&[]);
    let (profile, pids) = profile_of(&exe, &[("nonsense", "otel", 7)]);
    let p = process(&profile, pids[0]);
    assert_eq!(p.weight_form, WeightForm::Unrecognized);
    // Sums stay finite (weights clamped, no wrap), intervals unavailable.
    assert!(p.totals.alloc_bytes.is_finite() && p.totals.alloc_bytes > 0.0);
    assert!(p.totals.live_ci95_known().is_none());
    assert!(p.totals.alloc_ci95().is_nan());
    for s in &p.stacks {
        assert!(s.totals.live_ci95_known().is_none(), "{s:?}");
    }
    let report = allocprof::output::report::render(&profile, Default::default());
    assert!(report.contains("± ?"), "{report}");
    let json: serde_json::Value =
        serde_json::from_slice(&allocprof::output::export::json::render(&profile)).unwrap();
    let jp = json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pids[0])
        .unwrap();
    assert_eq!(jp["weight_form"], "unrecognized");
    assert!(jp["totals"]["live_bytes_ci95"].is_null(), "{jp}");
    assert!(json["totals"]["alloc_bytes_ci95"].is_null());
}

/// A third-party-style emitter built only from contrib/allocprof_probes.h
/// and its own sampler.
#[test]
fn an_emitter_built_from_the_contract_header_is_profiled() {
    let exe = kit_emitter(None);
    let (sites, problems) = allocprof::process::discover::probe_sites(&exe).unwrap();
    assert!(problems.is_empty() && sites.len() == 2, "{problems:?}");
    // And another provider name through the same header, in the same session.
    let dd = kit_emitter(Some("ddheap"));
    let mut runs: Vec<_> = (201..201 + RUNS)
        .map(|seed| (exe.as_path(), "points", "otel", seed))
        .collect();
    runs.push((dd.as_path(), "inverse", "otel", 300));
    let (profile, mut pids) = profile_of_each(&runs);
    let dd_pid = pids.pop().unwrap();
    let (mut covered, mut intervals) = (0, 0);
    for pid in &pids {
        let p = process(&profile, *pid);
        assert_eq!(p.contract(), "otel_memory");
        assert_eq!(
            p.weight_form,
            WeightForm::PointsTimesInterval { interval: RATE }
        );
        // The frame the probe function sets up: its caller (allocate,
        // with fire_alloc inlined) is the next frame, not skipped.
        for s in &p.stacks {
            let callers: Vec<&str> = s
                .frames
                .iter()
                .filter(|f| !f.inlined)
                .map(|f| &*f.function)
                .take(2)
                .collect();
            assert_eq!(callers, ["allocprof_probe_alloc", "allocate"], "{s:?}");
        }
        let (c, n) = check_sites(p, "points");
        covered += c;
        intervals += n;
    }
    assert_coverage("header, nsamples × R", covered, intervals);
    let p = process(&profile, dd_pid);
    assert_eq!(p.contract(), "ddheap");
    assert_eq!(p.weight_form, WeightForm::InverseProbability);
    check_sites(p, "inverse");
}
