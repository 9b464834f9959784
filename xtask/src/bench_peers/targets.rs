//! The "Issue-31 targets" table that closes `cargo xtask bench peers`: each
//! target with what the run measured and a verdict, or "not run" and why
//! where its section did not run (never a verdict then).

use super::{TARGET_ROW, cell, sections::Section, workloads::Workload};
use crate::{
    bench_alloc::{
        BACKENDS, BIG_TARGET, BigBlocks, FAST_PATH_TARGET, Group, Instructions, MODES, median,
    },
    bench_pipeline::{COST_LOOPS, SampledCost},
};

/// Target 3: attached over unattached wall time at the default settings,
/// on every workload.
const ATTACHED_RATIO: f64 = 1.05;
/// Target 3: µs of the target's CPU added per sampled allocation and per
/// sampled free, in `bench pipeline`'s one- and two-thread cost loops.
const ALLOC_US: f64 = 1.0;
const FREE_US: f64 = 0.3;
/// Target 4: the real programs attached, over their usual allocator.
const PROGRAMS_RATIO: f64 = 1.02;
/// Target 5: the in-process samplers `TARGET_ROW` must be faster than,
/// by their setup names.
pub(super) const SAMPLERS: [&str; 2] = [
    "jemalloc `prof:true,lg_prof_sample:19`",
    "tcmalloc, 512 KiB sampling",
];

/// A setup `--pid`-attached against the same unattached, on one workload.
pub(super) struct Pair {
    /// Attached wall time over unattached, round by round.
    pub(super) ratios: Vec<f64>,
    /// Sampled allocations and frees per second of the unattached run.
    pub(super) events_per_sec: f64,
}

/// What one peers workload measured for the targets.
pub(super) struct WorkloadFigures {
    /// `TARGET_ROW` against `liballocprof.so` unattached, both at the
    /// default settings.
    pub(super) attached: Pair,
    /// `TARGET_ROW` over the baseline, round by round.
    pub(super) ours: Vec<f64>,
    /// Each of `SAMPLERS` over the baseline, round by round.
    pub(super) samplers: [Vec<f64>; 2],
}

/// What the run measured, each section's figures or why it did not run.
pub(super) struct Measured<'a> {
    /// Per workload and backend, the default settings' row.
    pub(super) fast_path: &'a Section<Vec<Group>>,
    /// Per workload and backend, callgrind's instructions per pair.
    pub(super) instructions: &'a Section<Vec<Instructions>>,
    /// Per block size and library.
    pub(super) big_blocks: &'a Section<Vec<BigBlocks>>,
    /// Per thread count, `bench pipeline`'s cost loop.
    pub(super) costs: &'a Section<Vec<(&'static str, SampledCost)>>,
    /// Every peers workload, run or not.
    pub(super) workloads: &'a [(&'a Workload, Section<WorkloadFigures>)],
}

/// "met", or by how much a ratio misses `target` (in % of the baseline).
pub(crate) fn ratio_verdict(m: f64, target: f64) -> String {
    if m <= target {
        "met".to_string()
    } else {
        format!("missed by {}%", percent((m - target) * 100.0))
    }
}

/// A positive percentage, with the digits a small miss needs to read as
/// one (not "0.0").
fn percent(p: f64) -> String {
    if p < 0.1 {
        format!("{p:.2}")
    } else {
        format!("{p:.1}")
    }
}

fn us_verdict(m: f64, target: f64) -> String {
    if m <= target {
        "met".to_string()
    } else {
        format!("missed by {:.2} µs", m - target)
    }
}

/// A row whose section did not run: why, and no verdict.
fn not_run(target: &str, what: &str, why: &str) {
    println!("| {target} | {what} | not run: {why} | not run |");
}

/// The issue-31 targets, each with what this run measured and a verdict:
/// target, what was compared, measured (median and min–max), verdict.
pub(super) fn print_targets(m: &Measured) {
    println!("## Issue-31 targets");
    println!();
    println!("| target | what | measured: median (min–max) | verdict |");
    println!("|---|---|---|---|");
    fast_path(m);
    big_blocks(m);
    attached(m);
    costs(m);
    programs(m);
    samplers(m);
}

/// Target 1: every `bench alloc` workload on every backend.
fn fast_path(m: &Measured) {
    let target =
        format!("1. fast path, default settings: ≤ {FAST_PATH_TARGET} × the plain backend");
    for mode in MODES {
        for (setup, reference) in BACKENDS {
            let what = format!("{mode}: {setup} vs {reference}");
            let instructions = match m.instructions {
                Ok(rows) => rows
                    .iter()
                    .find(|i| i.mode == mode && i.setup == setup)
                    .map(|i| {
                        format!(
                            "instructions per pair {:.1} vs {:.1} ({:+.1}, {:.3})",
                            i.layer,
                            i.plain,
                            i.layer - i.plain,
                            i.layer / i.plain
                        )
                    })
                    .unwrap_or_else(|| "instructions: no row".to_string()),
                Err(why) => format!("instructions not run: {why}"),
            };
            let row = match m.fast_path {
                Ok(groups) => groups
                    .iter()
                    .find(|g| g.mode == mode && g.setup == setup)
                    .map(|g| &g.rows[0])
                    .ok_or_else(|| "no row".to_string()),
                Err(why) => Err(why.clone()),
            };
            match row {
                Ok(r) => println!(
                    "| {target} | {what} | {:.3} ({:.3}–{:.3}); {instructions} | {} |",
                    r.ratio,
                    r.min,
                    r.max,
                    ratio_verdict(r.ratio, FAST_PATH_TARGET)
                ),
                // Both left out for the same reason: say it once.
                Err(why) if m.instructions.as_ref().err() == Some(&why) => {
                    not_run(&target, &what, &why)
                }
                Err(why) => not_run(&target, &what, &format!("{why}; {instructions}")),
            }
        }
    }
}

/// Target 2: each block size on each library, against its plain backend.
fn big_blocks(m: &Measured) {
    let target = format!(
        "2. big blocks (1–64 MiB malloc/memset/free, CPU time), default settings: ≤ {BIG_TARGET} × the plain backend"
    );
    match m.big_blocks {
        Ok(rows) => {
            for b in rows {
                println!(
                    "| {target} | {} MiB: {} vs {} | {:.3} ({:.3}–{:.3}); `ALLOCPROF_RATE=0` {:.3}; plain {:.0} ns/iteration | {} |",
                    b.mib,
                    b.setup,
                    b.reference,
                    b.on.ratio,
                    b.on.min,
                    b.on.max,
                    b.off.ratio,
                    b.plain_ns,
                    ratio_verdict(b.on.ratio, BIG_TARGET)
                );
            }
        }
        Err(why) => not_run(&target, "1–64 MiB, both libraries", why),
    }
}

/// Target 3, first part: attached / unattached on every workload.
fn attached(m: &Measured) {
    let target = format!(
        "3. attached at the default settings: `allocprof --pid` / unattached ≤ {ATTACHED_RATIO:.2}"
    );
    for (w, figures) in m.workloads {
        match figures {
            Ok(f) => println!(
                "| {target} | {}: liballocprof.so, {:.1}k sampled events/s | {} | {} |",
                w.name,
                f.attached.events_per_sec / 1e3,
                cell(&f.attached.ratios),
                ratio_verdict(median(&f.attached.ratios), ATTACHED_RATIO)
            ),
            Err(why) => not_run(&target, w.name, why),
        }
    }
}

/// Target 3, second part: `bench pipeline`'s cost loops.
fn costs(m: &Measured) {
    for (what, program, target, pick) in [
        (
            "allocation",
            "alloc",
            ALLOC_US,
            (|c| c.0) as fn((f64, f64)) -> f64,
        ),
        ("free", "free", FREE_US, |c| c.1),
    ] {
        let target_text =
            format!("3. attached: ≤ {target} µs of the target's CPU per sampled {what}");
        let loops: Vec<_> = match m.costs {
            Ok(costs) => costs.iter().map(|(t, c)| (*t, Ok(c))).collect(),
            Err(why) => COST_LOOPS.iter().map(|(t, _)| (*t, Err(why))).collect(),
        };
        for (threads, c) in loops {
            let what_text =
                format!("`bench pipeline` cost loop, {threads}, every allocation sampled");
            let c = match c {
                Ok(c) => c,
                Err(why) => {
                    not_run(&target_text, &what_text, why);
                    continue;
                }
            };
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
                "| {target_text} | {what_text} | {:.2} µs ({:.2}–{:.2}){program} | {verdict} |",
                pick(c.added),
                pick(c.added_min),
                pick(c.added_max),
            );
        }
    }
}

/// Target 4: the real programs attached, against their usual allocator.
fn programs(m: &Measured) {
    let target = format!(
        "4. real programs: {TARGET_ROW} ≤ {PROGRAMS_RATIO} × the program with its usual allocator"
    );
    for (w, figures) in m.workloads.iter().filter(|(w, _)| !w.churn) {
        let what = format!("{} (against {})", w.name, w.baseline);
        match figures {
            Ok(f) => println!(
                "| {target} | {what} | {} | {} |",
                cell(&f.ours),
                ratio_verdict(median(&f.ours), PROGRAMS_RATIO)
            ),
            Err(why) => not_run(&target, &what, why),
        }
    }
}

/// Target 5: faster than each in-process sampler, by the medians of the
/// ratios to the same baseline in the same rounds.
fn samplers(m: &Measured) {
    let target = format!("5. {TARGET_ROW} faster than the in-process samplers");
    for (w, figures) in m.workloads {
        for (i, sampler) in SAMPLERS.iter().enumerate() {
            let what = format!("{}: vs {sampler} (each over {})", w.name, w.baseline);
            let f = match figures {
                Ok(f) => f,
                Err(why) => {
                    not_run(&target, &what, why);
                    continue;
                }
            };
            let (ours, theirs) = (median(&f.ours), median(&f.samplers[i]));
            let verdict = if ours < theirs {
                "met".to_string()
            } else {
                format!("missed by {}%", percent((ours / theirs - 1.0) * 100.0))
            };
            println!(
                "| {target} | {what} | ours {}, theirs {} | {verdict} |",
                cell(&f.ours),
                cell(&f.samplers[i])
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_above_its_target_is_missed_by_the_difference() {
        assert_eq!(ratio_verdict(1.02, 1.02), "met");
        assert_eq!(ratio_verdict(1.031, 1.02), "missed by 1.1%");
        assert_eq!(ratio_verdict(1.0204, 1.02), "missed by 0.04%");
        assert_eq!(us_verdict(0.25, 0.3), "met");
        assert_eq!(us_verdict(1.5, 1.0), "missed by 0.50 µs");
    }
}
