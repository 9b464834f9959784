//! The process table's trees (`t`): each process tree of `--pid` folded
//! under its root row, which shows the tree's figures and how many
//! processes are under it; unfolded, its members follow, each under its
//! parent. A tree is made of the rows shown: a process whose parent has no
//! row (not profiled, filtered out, hidden) roots a tree of its own.

use std::collections::HashSet;

use super::{HashMap, Row, RowId};
use allocprof::{ids::Pid, model::profile::ProcessKey};

/// A process row's place in its tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeMark {
    /// A tree's root: its figures are its own plus its running members'
    /// (a gone member's are at exit, not live); `members` processes are
    /// under it.
    Root { members: usize, unfolded: bool },
    /// A member, `depth` below `root`, under `parent`.
    Member {
        depth: usize,
        parent: Pid,
        root: ProcessKey,
    },
}

fn key_of(row: &Row) -> Option<ProcessKey> {
    match row.id {
        RowId::Process(key) => Some(key),
        _ => None,
    }
}

/// Marks the process `rows` with their trees (`parents`: each pid's parent,
/// from the profile) and gives each root its tree's figures. Before the
/// sort: roots sort by their trees' figures.
pub fn mark(rows: &mut [Row], parents: &HashMap<Pid, Option<Pid>>, unfolded: &HashSet<ProcessKey>) {
    // The row standing for a pid: its running image, else its first.
    let mut by_pid: HashMap<Pid, usize> = HashMap::default();
    for (i, r) in rows.iter().enumerate() {
        if let Some(key) = key_of(r) {
            let at = by_pid.entry(key.pid).or_insert(i);
            if rows[*at].gone && !r.gone {
                *at = i;
            }
        }
    }
    // A pid's root and depth: up its parents while they have rows. A pid
    // cycle (reuse could make one) roots where it is found.
    let place = |pid: Pid| -> (Pid, usize) {
        let (mut at, mut seen) = (pid, vec![pid]);
        while let Some(up) = parents.get(&at).copied().flatten()
            && by_pid.contains_key(&up)
        {
            if seen.contains(&up) {
                return (pid, 0);
            }
            seen.push(up);
            at = up;
        }
        (at, seen.len() - 1)
    };
    let mut placed: Vec<Option<(usize, usize, Pid)>> = vec![None; rows.len()];
    for (i, r) in rows.iter().enumerate() {
        let Some(key) = key_of(r) else { continue };
        let (root, depth) = place(key.pid);
        placed[i] = Some(if by_pid[&key.pid] != i {
            // Another image of a pid that has a row: under that row.
            (by_pid[&root], depth + 1, key.pid)
        } else {
            let parent = parents.get(&key.pid).copied().flatten();
            (by_pid[&root], depth, parent.unwrap_or(key.pid))
        });
    }
    let mut sums: Vec<Row> = rows.to_vec();
    let mut members = vec![0usize; rows.len()];
    for (i, p) in placed.iter().enumerate() {
        let Some((root, depth, _)) = *p else { continue };
        if depth == 0 {
            continue;
        }
        members[root] += 1;
        if rows[i].gone {
            continue;
        }
        let (sum, r) = (&mut sums[root], &rows[i]);
        sum.totals += r.totals;
        sum.share += r.share;
        let add = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        sum.alloc_rate = add(sum.alloc_rate, r.alloc_rate);
        sum.growth = add(sum.growth, r.growth);
        sum.since_baseline = add(sum.since_baseline, r.since_baseline);
    }
    for (i, p) in placed.iter().enumerate() {
        let Some((root, depth, parent)) = *p else {
            continue;
        };
        let root_key = key_of(&rows[root]).expect("a root is a process row");
        rows[i].tree = Some(if depth == 0 {
            rows[i].totals = sums[i].totals;
            rows[i].share = sums[i].share.min(1.0);
            rows[i].alloc_rate = sums[i].alloc_rate;
            rows[i].growth = sums[i].growth;
            rows[i].since_baseline = sums[i].since_baseline;
            TreeMark::Root {
                members: members[i],
                unfolded: unfolded.contains(&root_key),
            }
        } else {
            TreeMark::Member {
                depth,
                parent,
                root: root_key,
            }
        });
    }
}

/// The marked rows, sorted, in tree order: each root where the sort put
/// it, then, if unfolded, its members, each under its parent (siblings in
/// the sort's order). The labels show the folds.
pub fn order(rows: Vec<Row>) -> Vec<Row> {
    let mut roots = Vec::new();
    let mut children: HashMap<Pid, Vec<Row>> = HashMap::default();
    for r in rows {
        match r.tree {
            Some(TreeMark::Member { parent, .. }) => children.entry(parent).or_default().push(r),
            _ => roots.push(r),
        }
    }
    let mut out = Vec::new();
    for mut root in roots {
        let Some(key) = key_of(&root) else {
            out.push(root);
            continue;
        };
        let (members, unfolded) = match root.tree {
            Some(TreeMark::Root { members, unfolded }) => (members, unfolded),
            _ => (0, false),
        };
        root.label = match (members, unfolded) {
            (0, _) => format!("  {}", root.label),
            (n, false) => format!("▸ {} ({n} under)", root.label),
            (n, true) => format!("▾ {} ({n} under)", root.label),
        };
        out.push(root);
        if unfolded {
            let mut seen = HashSet::new();
            seen.insert(key.pid);
            add_children(key.pid, &mut children, &mut seen, &mut out);
        }
    }
    out
}

/// `pid`'s children and theirs, depth first.
fn add_children(
    pid: Pid,
    children: &mut HashMap<Pid, Vec<Row>>,
    seen: &mut HashSet<Pid>,
    out: &mut Vec<Row>,
) {
    for mut child in children.remove(&pid).unwrap_or_default() {
        let depth = match child.tree {
            Some(TreeMark::Member { depth, .. }) => depth,
            _ => 1,
        };
        child.label = format!("{}└ {}", "  ".repeat(depth), child.label);
        let child_pid = key_of(&child).map(|k| k.pid);
        out.push(child);
        if let Some(p) = child_pid
            && seen.insert(p)
        {
            add_children(p, children, seen, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::rows::{
        Inputs, process_rows,
        tests::{process, profile},
    };
    use allocprof::model::profile::{ProcessProfile, ProcessState};

    fn child(pid: u32, parent: u32, name: &str, live: f64) -> ProcessProfile {
        ProcessProfile {
            parent: Some(Pid(parent)),
            ..process(pid, name, &[(&["work", "main"], live, live)])
        }
    }

    /// A postmaster (1) with two backends (2, 3) and a grandchild (4) of
    /// 3; another process (9) alone; an exited backend (5).
    fn rows(unfolded: &[u32]) -> Vec<Row> {
        let mut gone = child(5, 1, "exited", 7000.0);
        gone.state = ProcessState::Exited;
        let p = profile(
            1,
            vec![
                process(1, "postmaster", &[(&["init", "main"], 100.0, 100.0)]),
                child(2, 1, "backend", 2000.0),
                child(3, 1, "backend", 500.0),
                child(4, 3, "helper", 40.0),
                gone,
                process(9, "other", &[(&["init", "main"], 1000.0, 1000.0)]),
            ],
        );
        let parents = p.processes.iter().map(|q| (q.key.pid, q.parent)).collect();
        let mut rows = process_rows(Inputs {
            current: &p,
            rate_ref: None,
            growth_ref: None,
            baseline: None,
        });
        let unfolded = p
            .processes
            .iter()
            .map(|q| q.key)
            .filter(|k| unfolded.contains(&k.pid.0))
            .collect();
        mark(&mut rows, &parents, &unfolded);
        // Sorted by live bytes, gone ones last, as the table would.
        rows.sort_by(|a, b| {
            (a.gone.cmp(&b.gone)).then(b.totals.live_bytes.total_cmp(&a.totals.live_bytes))
        });
        order(rows)
    }

    fn shown(rows: &[Row]) -> Vec<(String, f64)> {
        rows.iter()
            .map(|r| (r.label.clone(), r.totals.live_bytes))
            .collect()
    }

    #[test]
    fn a_folded_tree_is_its_root_with_the_tree_s_live_heap_and_members() {
        // The running members' heap adds up (100 + 2000 + 500 + 40); the
        // exited one is counted as a member, its heap (at exit) is not.
        assert_eq!(
            shown(&rows(&[])),
            [
                ("▸ postmaster (4 under)".to_string(), 2640.0),
                ("  other".to_string(), 1000.0),
            ]
        );
    }

    #[test]
    fn an_unfolded_tree_lists_each_member_under_its_parent() {
        assert_eq!(
            shown(&rows(&[1])),
            [
                ("▾ postmaster (4 under)".to_string(), 2640.0),
                ("  └ backend".to_string(), 2000.0),
                ("  └ backend".to_string(), 500.0),
                ("    └ helper".to_string(), 40.0),
                ("  └ exited".to_string(), 7000.0),
                ("  other".to_string(), 1000.0),
            ]
        );
        let marks: Vec<_> = rows(&[1]).iter().map(|r| r.tree).collect();
        let root = ProcessKey {
            pid: Pid(1),
            generation: 0,
        };
        assert_eq!(
            marks[3],
            Some(TreeMark::Member {
                depth: 2,
                parent: Pid(3),
                root
            })
        );
    }

    #[test]
    fn a_pid_cycle_loses_no_row() {
        let p = profile(1, vec![child(1, 2, "a", 10.0), child(2, 1, "b", 20.0)]);
        let parents = p.processes.iter().map(|q| (q.key.pid, q.parent)).collect();
        let mut rows = process_rows(Inputs {
            current: &p,
            rate_ref: None,
            growth_ref: None,
            baseline: None,
        });
        mark(&mut rows, &parents, &HashSet::new());
        assert_eq!(order(rows).len(), 2);
    }
}
