//! Callers and callees of one function (the `c` key): over the stacks of a
//! process (or of every running process), the live bytes allocated through
//! the function, split by the function that called it and by the one it
//! called. Pure: a profile in, sorted lists out.
//!
//! A stack counts once even where the function recurses (its outermost
//! call: what a leak hunt follows outward); a stack where the function is
//! the innermost frame allocated in it directly (`[allocates here]`), and
//! one where it is the outermost has no caller (`[stack root]`).

use std::{collections::HashMap, sync::Arc};

use allocprof::{
    model::profile::{ProcessKey, ProcessState, Profile},
    symbolize::Frame,
};

/// The callee of a function that allocated itself.
pub const SELF: &str = "[allocates here]";
/// The caller of a function at the root of its stack.
pub const ROOT: &str = "[stack root]";

/// One caller or callee: its name, the live bytes through the pair, and
/// that as a share of the function's.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    pub name: Arc<str>,
    pub live_bytes: f64,
    /// 0..=1 of [`Callers::live_bytes`].
    pub share: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Callers {
    pub function: Arc<str>,
    /// Live bytes of the stacks through the function.
    pub live_bytes: f64,
    /// Stacks through it.
    pub stacks: usize,
    /// Largest first, then by name.
    pub callers: Vec<Edge>,
    pub callees: Vec<Edge>,
}

impl Callers {
    /// `function`'s callers and callees in the stacks of `scope` (`None`:
    /// every running process).
    pub fn of(profile: &Profile, scope: Option<ProcessKey>, function: &str) -> Callers {
        let mut callers: HashMap<Arc<str>, f64> = HashMap::new();
        let mut callees: HashMap<Arc<str>, f64> = HashMap::new();
        let (mut live_bytes, mut stacks) = (0.0, 0);
        let processes = profile.processes.iter().filter(|p| match scope {
            Some(key) => p.key == key,
            None => p.state == ProcessState::Live,
        });
        for s in processes.flat_map(|p| &p.stacks) {
            // Innermost first: the outermost call is the last match.
            let Some(i) = s.frames.iter().rposition(|f| &*f.function == function) else {
                continue;
            };
            let live = s.totals.live_bytes;
            live_bytes += live;
            stacks += 1;
            let name = |f: Option<&Frame>, none: &str| {
                f.map_or_else(|| Arc::from(none), |f| f.function.clone())
            };
            *callers.entry(name(s.frames.get(i + 1), ROOT)).or_default() += live;
            let callee = i.checked_sub(1).and_then(|j| s.frames.get(j));
            *callees.entry(name(callee, SELF)).or_default() += live;
        }
        let edges = |m: HashMap<Arc<str>, f64>| {
            let mut v: Vec<Edge> = m
                .into_iter()
                .map(|(name, live)| Edge {
                    name,
                    live_bytes: live,
                    share: if live_bytes > 0.0 {
                        (live / live_bytes).clamp(0.0, 1.0)
                    } else {
                        0.0
                    },
                })
                .collect();
            v.sort_by(|a, b| {
                b.live_bytes
                    .total_cmp(&a.live_bytes)
                    .then_with(|| a.name.cmp(&b.name))
            });
            v
        };
        Callers {
            function: function.into(),
            live_bytes,
            stacks,
            callers: edges(callers),
            callees: edges(callees),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::rows::tests::{process, profile};

    fn names(edges: &[Edge]) -> Vec<(&str, f64)> {
        edges.iter().map(|e| (&*e.name, e.live_bytes)).collect()
    }

    #[test]
    fn callers_and_callees_split_the_function_s_live_bytes() {
        let mut gone = process(3, "gone", &[(&["parse", "main"], 1e6, 1e6)]);
        gone.state = ProcessState::Exited;
        let p = profile(
            1,
            vec![
                process(
                    7,
                    "server",
                    &[
                        (&["malloc_wrap", "parse", "handle", "main"], 300.0, 0.0),
                        (&["parse", "handle", "main"], 100.0, 0.0),
                        (&["parse", "load", "main"], 600.0, 0.0),
                        // Recursion counts once, at its outermost call.
                        (&["parse", "parse", "main"], 50.0, 0.0),
                        (&["other", "main"], 1000.0, 0.0),
                    ],
                ),
                process(9, "worker", &[(&["parse"], 10.0, 0.0)]),
                gone,
            ],
        );
        let c = Callers::of(&p, None, "parse");
        assert_eq!(c.live_bytes, 1060.0);
        assert_eq!(c.stacks, 5);
        assert_eq!(
            names(&c.callers),
            [
                ("load", 600.0),
                ("handle", 400.0),
                ("main", 50.0),
                (ROOT, 10.0)
            ]
        );
        assert_eq!(
            names(&c.callees),
            [(SELF, 710.0), ("malloc_wrap", 300.0), ("parse", 50.0)]
        );
        assert!((c.callers[0].share - 600.0 / 1060.0).abs() < 1e-12);
        // One process: its stacks only, exited or not.
        let gone = Callers::of(
            &p,
            Some(ProcessKey {
                pid: allocprof::ids::Pid(3),
                generation: 0,
            }),
            "parse",
        );
        assert_eq!(names(&gone.callers), [("main", 1e6)]);
        // A function no stack goes through.
        let none = Callers::of(&p, None, "nowhere");
        assert_eq!((none.live_bytes, none.stacks), (0.0, 0));
        assert!(none.callers.is_empty() && none.callees.is_empty());
    }
}
