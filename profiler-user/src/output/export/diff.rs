//! The growth between two snapshots of the same run (`allocprof diff A B`):
//! per process (pid, generation) and stack, B's estimates minus A's. Live
//! bytes that grew are what a leak hunt looks for; allocated bytes and
//! objects become "allocated between the snapshots".
//!
//! Confidence intervals are not carried over: the two snapshots share their
//! samples, so the variance of a difference is not the sum of variances, and
//! the files do not hold the per-sample data to compute it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use profiler_common::DROP_REASONS;

use crate::{
    model::profile::{ProcessKey, ProcessProfile, Profile, StackProfile, sort_processes},
    model::stats::Totals,
    symbolize::Frame,
};

/// `b - a`, stack by stack. Processes and stacks present in only one side
/// count as zero in the other.
pub fn growth(a: &Profile, b: &Profile) -> Profile {
    type Stacks = HashMap<Arc<[Frame]>, Totals>;
    let mut procs: BTreeMap<ProcessKey, (&ProcessProfile, Stacks)> = BTreeMap::new();
    for (sign, side) in [(-1.0, a), (1.0, b)] {
        for p in &side.processes {
            // B's identity wins (its name and rate are the later ones).
            let entry = procs.entry(p.key).or_insert_with(|| (p, HashMap::new()));
            if sign > 0.0 {
                entry.0 = p;
            }
            for s in &p.stacks {
                let t = entry.1.entry(s.frames.clone()).or_default();
                *t += scaled(&s.totals, sign);
            }
        }
    }
    let mut processes: Vec<ProcessProfile> = procs
        .into_iter()
        .map(|(key, (p, stacks))| {
            let stacks = stacks
                .into_iter()
                .map(|(frames, totals)| StackProfile { frames, totals })
                .collect();
            ProcessProfile::from_stacks(key, p.name.clone(), p.state, p.rate, stacks)
        })
        .collect();
    sort_processes(&mut processes);
    Profile {
        processes,
        drops: [0; DROP_REASONS],
        elapsed: b.elapsed.saturating_sub(a.elapsed),
        unwind: b.unwind,
        min_age: b.min_age,
        attached_at: None,
        ran_before_attach: Vec::new(),
    }
}

fn scaled(t: &Totals, sign: f64) -> Totals {
    Totals {
        live_bytes: sign * t.live_bytes,
        live_objects: sign * t.live_objects,
        alloc_bytes: sign * t.alloc_bytes,
        alloc_objects: sign * t.alloc_objects,
        // Neither variances nor sample counts of a difference are known.
        ..Totals::default()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        model::stats::Quantity,
        output::export::{collapsed, tests::hand_made},
    };

    #[test]
    fn growth_is_b_minus_a_per_stack() {
        let a = hand_made();
        let mut b = hand_made();
        b.elapsed += Duration::from_secs(10);
        // site_large grew by 1 MiB; everything else is unchanged.
        b.processes[0].stacks[0].totals.live_bytes += 1048576.0;
        b.processes[0].stacks[0].totals.alloc_bytes += 1048576.0;
        let g = growth(&a, &b);
        assert_eq!(g.elapsed, Duration::from_secs(10));
        assert_eq!(g.totals().live_bytes, 1048576.0);
        assert_eq!(
            collapsed::render(&g, Quantity::InuseBytes),
            "demo (7);__libc_start_call_main;main;site_large;inlined_helper 1048576\n"
        );
        // Shrinking shows as negative growth, which the folded view omits.
        let back = growth(&b, &a);
        assert_eq!(back.totals().live_bytes, -1048576.0);
        assert_eq!(collapsed::render(&back, Quantity::InuseBytes), "");
    }

    #[test]
    fn a_process_only_in_b_is_all_growth() {
        let a = Profile::default();
        let b = hand_made();
        let g = growth(&a, &b);
        assert_eq!(g.totals().live_bytes, b.totals().live_bytes);
        assert_eq!(g.processes.len(), b.processes.len());
    }
}
