//! The other benches' sections `cargo xtask bench peers` runs so that one
//! run gives every issue-31 target a verdict: `bench alloc`'s fast path at
//! the default settings, its callgrind instructions per pair and its big
//! blocks, and `bench pipeline`'s cost loop. A section that fails (or that
//! `--only` leaves out) is reported as not run, with why, in the closing
//! table, rather than ending a 20-minute run.

use std::path::Path;

use anyhow::Result;

use super::load;
use crate::{
    bench_alloc::{
        self, BigBlocks, DEFAULT_RATE, Group, Instructions, PER_OPERATION_HEAD, Programs,
    },
    bench_pipeline::{self, SampledCost},
};

/// A section's figures, or why it did not run.
pub(super) type Section<T> = Result<T, String>;

/// The sections' names, as `--only` matches them.
pub(super) const FAST_PATH: &str = "fast path";
pub(super) const INSTRUCTIONS: &str = "instructions";
pub(super) const BIG_BLOCKS: &str = "big blocks";
pub(super) const COSTS: &str = "sampled cost";
pub(super) const ALL: [&str; 4] = [FAST_PATH, INSTRUCTIONS, BIG_BLOCKS, COSTS];

/// The fast-path section's (pairs per run, rounds): fewer rounds than
/// `bench alloc`'s 21, at one rate, ≈ 1–2 minutes.
const FAST_PATH_FULL: (&str, usize) = ("5000000", 15);
const FAST_PATH_QUICK: (&str, usize) = ("300000", 3);

/// Runs section `name` with `run` unless `--only` left it out; a failure
/// becomes its reason for not running.
pub(super) fn section<T>(
    name: &str,
    only: Option<&str>,
    run: impl FnOnce() -> Result<T>,
) -> Section<T> {
    if let Some(o) = only
        && !name.contains(o)
    {
        return Err(format!("`--only {o}` left it out"));
    }
    run().map_err(|e| {
        eprintln!("peers: the {name} section failed: {e:#}");
        format!("failed: {e:#}")
    })
}

/// The fast-path target's figures: `bench alloc`'s per-operation section
/// at the default settings alone (`ALLOCPROF_RATE` unset).
pub(super) fn fast_path(programs: &Programs, quick: bool) -> Result<Vec<Group>> {
    let (iters, rounds) = if quick {
        FAST_PATH_QUICK
    } else {
        FAST_PATH_FULL
    };
    eprintln!("peers: the fast path ({rounds} rounds of {iters} pairs)");
    println!(
        "## Fast path: ratio to the plain backend at the default settings \
         (`bench alloc`'s per-operation section: median of {rounds} interleaved rounds, \
         min-max of the per-round ratios; {iters} pairs per run)"
    );
    println!();
    println!("Plain mimalloc reference: {}", programs.plain_cmd);
    println!("load average at the start: {}", load());
    println!();
    println!("{PER_OPERATION_HEAD}");
    let rates = [DEFAULT_RATE];
    let pairs: f64 = iters.parse()?;
    let groups =
        bench_alloc::per_operation(programs, &rates, iters, rounds, |g| g.print(&rates, pairs))?;
    println!();
    println!("load average at the end: {}", load());
    println!();
    Ok(groups)
}

/// Instructions per malloc/free pair under callgrind, each backend plain
/// and with the layer at the default settings.
pub(super) fn instructions(programs: &Programs, quick: bool) -> Result<Vec<Instructions>> {
    eprintln!("peers: the fast path's instructions (callgrind)");
    let rows = bench_alloc::instructions(programs, quick)?;
    bench_alloc::print_instructions(&rows);
    println!();
    Ok(rows)
}

/// `bench alloc`'s big blocks: each library against its plain backend.
pub(super) fn big_blocks(programs: &Programs, quick: bool) -> Result<Vec<BigBlocks>> {
    eprintln!("peers: big blocks");
    println!("load average at the start: {}", load());
    let rows = bench_alloc::big_blocks(programs, quick)?;
    println!();
    println!("load average at the end: {}", load());
    println!();
    Ok(rows)
}

/// The attached-cost targets' figures: `bench pipeline`'s cost loop in one
/// thread and in two at once, every allocation sampled.
pub(super) fn sampled_costs(root: &Path) -> Result<Vec<(&'static str, SampledCost)>> {
    eprintln!("peers: the sampled alloc/free cost");
    let bench = bench_pipeline::Bench::new(root)?;
    let mut costs = Vec::new();
    for (threads, mode) in bench_pipeline::COST_LOOPS {
        costs.push((
            threads,
            bench_pipeline::sampled_cost(&bench, threads, mode)?,
        ));
    }
    println!("load average at the end: {}", load());
    println!();
    Ok(costs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_left_out_or_failed_says_why_and_one_chosen_runs() {
        let mut ran = false;
        let left_out = section(BIG_BLOCKS, Some("sqlite"), || {
            ran = true;
            Ok(())
        });
        assert!(!ran, "--only sqlite ran the big blocks");
        assert_eq!(left_out, Err("`--only sqlite` left it out".to_string()));
        let failed: Section<()> = section(COSTS, Some("cost"), || anyhow::bail!("no bpftool"));
        assert_eq!(failed, Err("failed: no bpftool".to_string()));
        assert_eq!(section(FAST_PATH, None, || Ok(7)), Ok(7));
    }
}
