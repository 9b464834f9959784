//! One table from the FDEs: sorted, overlaps cut (the later wins), gaps
//! marked `UNKNOWN`, equal neighbours merged; and the runs of FDEs that keep
//! a frame pointer.

use profiler_common::unwind::UnwindRow;

use super::MAX_FRAME_POINTER_RUNS;
use super::fdes::Fde;
use super::rules::{Rule, UNKNOWN};

/// The runs of consecutive FDEs (by address) that keep a frame pointer;
/// none past [`MAX_FRAME_POINTER_RUNS`].
pub(super) fn frame_pointer_runs(fdes: &mut [Fde]) -> Vec<(u64, u64)> {
    fdes.sort_unstable_by_key(|f| f.start);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut open = false;
    for f in fdes.iter() {
        if !f.keeps_frame_pointer() {
            open = false;
            continue;
        }
        match runs.last_mut() {
            Some(run) if open => run.1 = run.1.max(f.end),
            _ => {
                if runs.len() == MAX_FRAME_POINTER_RUNS {
                    return Vec::new();
                }
                runs.push((f.start, f.end));
                open = true;
            }
        }
    }
    runs
}

/// Whether `start..end` overlaps one of the intervals, given sorted by
/// start with `reach[i]` = the largest end among the first `i + 1`.
pub(super) fn overlaps(sorted: &[(u64, u64)], reach: &[u64], start: u64, end: u64) -> bool {
    let i = sorted.partition_point(|&(s, _)| s < end);
    i > 0 && reach[i - 1] > start
}

/// Appends a row keeping the table sorted and merged: rows at or past `pc`
/// are replaced (the last written wins), a row with its predecessor's rule
/// is not added.
fn push(rows: &mut Vec<UnwindRow>, pc: u64, rule: Rule) {
    let row = UnwindRow {
        pc,
        cfa_offset: rule.cfa_offset,
        rbp_offset: rule.rbp_offset,
        cfa_rule: rule.cfa_rule,
        rbp_rule: rule.rbp_rule,
    };
    while rows.last().is_some_and(|last| last.pc >= pc) {
        rows.pop();
    }
    if rows
        .last()
        .is_some_and(|last| UnwindRow { pc, ..*last } == row)
    {
        return;
    }
    rows.push(row);
}

/// The table of the FDEs (see the module docs for overlaps). Its length is
/// at most the FDEs' rows plus one per FDE.
pub(super) fn assemble(mut fdes: Vec<Fde>) -> Vec<UnwindRow> {
    // By start; equal starts: the wider first, so the narrower is written last and wins.
    fdes.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
    let mut rows = Vec::new();
    for (i, fde) in fdes.iter().enumerate() {
        // Cut where the next FDE starts (overlap: the later one wins).
        let end = match fdes.get(i + 1) {
            Some(next) if next.start < fde.end => next.start,
            _ => fde.end,
        };
        for &(pc, rule) in &fde.rows {
            if pc >= fde.start && pc < end {
                push(&mut rows, pc, rule);
            }
        }
        if end > fde.start {
            push(&mut rows, end, UNKNOWN);
        }
    }
    rows
}
