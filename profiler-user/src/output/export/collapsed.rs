//! Folded stacks for flamegraph.pl and inferno: `root;...;leaf VALUE`, the
//! process as the root frame `name (pid)`.

use std::{collections::BTreeMap, fmt::Write};

use crate::{model::profile::Profile, model::stats::Quantity, output::inert::inert};

pub fn render(profile: &Profile, value: Quantity) -> String {
    let mut out = String::new();
    for (line, v) in folded(profile, value) {
        let _ = writeln!(out, "{line} {v}");
    }
    out
}

/// The folded stacks and their rounded values, sorted (as inferno expects),
/// values below one half (nothing to draw, or negative growth) left out.
pub fn folded(profile: &Profile, value: Quantity) -> BTreeMap<String, u64> {
    // Identical lines (e.g. stacks that differ only in addresses that
    // symbolize the same) are summed, as the format expects.
    let mut lines: BTreeMap<String, f64> = BTreeMap::new();
    for p in &profile.processes {
        for s in &p.stacks {
            let v = s.totals.value(value);
            let mut line = sanitize(&p.label());
            for f in s.frames.iter().rev() {
                line.push(';');
                line.push_str(&sanitize(&f.flame_name()));
            }
            *lines.entry(line).or_default() += v;
        }
    }
    lines
        .into_iter()
        .filter(|(_, v)| *v >= 0.5)
        .map(|(line, v)| (line, v.round() as u64))
        .collect()
}

/// `;` separates frames and the last space separates the value; controls
/// (newlines included) become visible escapes, inert in a terminal.
fn sanitize(s: &str) -> String {
    inert(s).replace(';', ":")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::profile::{ProcessKey, ProcessProfile, ProcessState, StackProfile},
        model::stats::Totals,
        symbolize::Frame,
    };

    #[test]
    fn root_first_with_the_process_as_root() {
        let frames: Arc<[Frame]> = ["leaf;x", "main"]
            .iter()
            .map(|n| Frame::named(*n))
            .collect();
        let totals = Totals {
            live_bytes: 1234.4,
            alloc_objects: 7.6,
            ..Default::default()
        };
        let profile = Profile {
            processes: vec![ProcessProfile::from_stacks(
                ProcessKey {
                    pid: crate::ids::Pid(7),
                    generation: 0,
                },
                "demo".into(),
                ProcessState::Live,
                524_288,
                vec![StackProfile { frames, totals }],
            )],
            ..Default::default()
        };
        assert_eq!(
            render(&profile, Quantity::InuseBytes),
            "demo (7);main;leaf:x 1234\n"
        );
        assert_eq!(
            render(&profile, Quantity::AllocObjects),
            "demo (7);main;leaf:x 8\n"
        );
        assert_eq!(render(&profile, Quantity::AllocBytes), "");
    }
}
