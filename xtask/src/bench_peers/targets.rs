//! The "Issue-12 targets" table that closes `cargo xtask bench peers`: each
//! target with what the run measured and a verdict.

use super::{
    TARGET, TARGET_ROW, cell,
    workloads::{self, Workload},
};
use crate::{
    bench_alloc::{FAST_PATH_TARGET, Group, Instructions, median},
    bench_pipeline::SampledCost,
};

/// Added per sampled allocation and per sampled free, two threads
/// allocating at once, µs.
const ALLOC_US: f64 = 2.0;
const FREE_US: f64 = 0.8;
/// Attached over unattached wall time on the 2-thread churn, at no fewer
/// sampled events/s than `EVENTS_PER_SEC`.
const ATTACHED_RATIO: f64 = 1.10;
const EVENTS_PER_SEC: f64 = 40e3;

/// A setup `--pid`-attached against the same unattached, on one workload.
pub(super) struct Pair {
    /// The rate, e.g. `the default rate`, `ALLOCPROF_RATE=2600k`.
    pub(super) rate: String,
    /// Attached wall time over unattached, round by round.
    pub(super) ratios: Vec<f64>,
    /// Sampled allocations and frees per second of the unattached run.
    pub(super) events_per_sec: f64,
}

/// What the run measured (empty where a section did not run).
pub(super) struct Measured<'a> {
    /// Per workload and backend, the default rate's row.
    pub(super) fast_path: &'a [Group],
    /// Per workload and backend, callgrind's instructions per pair.
    pub(super) instructions: &'a [Instructions],
    /// Per thread count, `bench pipeline`'s cost loop.
    pub(super) costs: &'a [(&'static str, SampledCost)],
    /// Per workload and attached setup.
    pub(super) pairs: &'a [(&'a Workload, Pair)],
    /// Per workload, `TARGET_ROW` over the baseline, round by round.
    pub(super) programs: &'a [(&'a Workload, Vec<f64>)],
}

/// "met", or by how much a ratio misses `target` (in % of the baseline).
pub(crate) fn ratio_verdict(m: f64, target: f64) -> String {
    if m <= target {
        "met".to_string()
    } else {
        format!("missed by {:.1}%", (m - target) * 100.0)
    }
}

fn us_verdict(m: f64, target: f64) -> String {
    if m <= target {
        "met".to_string()
    } else {
        format!("missed by {:.2} µs", m - target)
    }
}

/// The issue-12 targets, each with what this run measured and a verdict:
/// target, workload, measured (median and min–max), verdict.
pub(super) fn print_targets(m: &Measured) {
    println!("## Issue-12 targets");
    println!();
    println!("| target | workload | measured: median (min–max) | verdict |");
    println!("|---|---|---|---|");
    for g in m.fast_path {
        let r = &g.rows[0];
        let instructions = m
            .instructions
            .iter()
            .find(|i| i.mode == g.mode && i.setup == g.setup)
            .map(|i| {
                format!(
                    "; instructions per pair {:.1} vs {:.1} ({:+.1})",
                    i.layer,
                    i.plain,
                    i.layer - i.plain
                )
            })
            .unwrap_or_default();
        println!(
            "| fast path, default rate: ≤ {FAST_PATH_TARGET} × the plain backend | {}: {} vs {} | {:.3} ({:.3}–{:.3}){instructions} | {} |",
            g.mode,
            g.setup,
            g.reference,
            r.ratio,
            r.min,
            r.max,
            ratio_verdict(r.ratio, FAST_PATH_TARGET)
        );
    }
    for (what, program, target, pick) in [
        (
            "allocation",
            "alloc",
            ALLOC_US,
            (|c| c.0) as fn((f64, f64)) -> f64,
        ),
        ("free", "free", FREE_US, |c| c.1),
    ] {
        for (threads, c) in m.costs {
            let program = c
                .programs
                .map(|p| format!("; eBPF {program} program {:.2} µs", pick(p)))
                .unwrap_or_default();
            let mut verdict = us_verdict(pick(c.added), target);
            // The program runs in the target's context: what attaching adds
            // cannot be less, unless the runs were disturbed.
            if c.programs.is_some_and(|p| pick(c.added) < pick(p)) {
                verdict.push_str(" (less than the program alone: runs disturbed, not conclusive)");
            }
            println!(
                "| attached: ≤ {target} µs added per sampled {what} (two threads at once) | `bench pipeline` cost loop, {threads}, every allocation sampled | {:.2} µs ({:.2}–{:.2}){program} | {verdict} |",
                pick(c.added),
                pick(c.added_min),
                pick(c.added_max),
            );
        }
    }
    for (w, pair) in m.pairs {
        if w.name != workloads::CHURN_2T {
            continue;
        }
        let r = median(&pair.ratios);
        let mut verdict = ratio_verdict(r, ATTACHED_RATIO);
        if pair.events_per_sec < EVENTS_PER_SEC {
            verdict.push_str(&format!(
                ", but at fewer than {:.0}k events/s",
                EVENTS_PER_SEC / 1e3
            ));
        }
        println!(
            "| attached / unattached wall ≤ {ATTACHED_RATIO:.2} at ≥ {:.0}k sampled events/s | {}, liballocprof.so at {}: `allocprof --pid` vs unattached, {:.0}k sampled events/s | {} | {verdict} |",
            EVENTS_PER_SEC / 1e3,
            w.name,
            pair.rate,
            pair.events_per_sec / 1e3,
            cell(&pair.ratios)
        );
    }
    for (w, r) in m.programs {
        if w.churn {
            continue;
        }
        println!(
            "| real programs: {TARGET_ROW} ≤ {TARGET} × the normal allocator | {} (against {}) | {} | {} |",
            w.name,
            w.baseline,
            cell(r),
            ratio_verdict(median(r), TARGET)
        );
    }
}
