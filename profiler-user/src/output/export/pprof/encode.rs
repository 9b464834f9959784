//! The encoder: a [`Profile`] as a Go-shaped heap `profile.proto`.

use std::{collections::BTreeMap, io::Write};

use flate2::{Compression, write::GzEncoder};
use profiler_common::DropReason;
use prost::Message;

use super::{
    LABEL_GENERATION, LABEL_PID, LABEL_PROCESS, SAMPLE_TYPES,
    proto::{self, Function, Label, Line, Location, Mapping, Sample, ValueType},
};
use crate::{
    model::profile::Profile,
    model::stats::{Totals, human_bytes, human_ci},
    output::export::tables::Tables,
    symbolize::Frame,
};

/// The profile as a gzip'd `profile.proto`.
pub fn render(profile: &Profile, time_nanos: i64) -> Vec<u8> {
    let bytes = to_proto(profile, time_nanos).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&bytes).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

/// Builds the `profile.proto` message: samples per process and stack, the
/// tables from [`Tables`] (pprof's ids are their positions + 1).
pub(crate) fn to_proto(profile: &Profile, time_nanos: i64) -> proto::Profile {
    let mut t = Tables::new(false);
    let sample_type = SAMPLE_TYPES
        .iter()
        .map(|(ty, u)| ValueType {
            r#type: string(&mut t, ty),
            unit: string(&mut t, u),
        })
        .collect();
    // Executables first: pprof takes the first mapping for the main binary.
    for p in &profile.processes {
        if let Some(module) = p.stacks.iter().find_map(|s| executable(&s.frames)) {
            t.mapping(module, p.build_ids.as_deref());
        }
    }
    let keys = [LABEL_PROCESS, LABEL_PID, LABEL_GENERATION].map(|k| string(&mut t, k));
    let mut rounding = Rounding::default();
    let mut samples = Vec::new();
    for p in &profile.processes {
        let name = string(&mut t, &p.name);
        let mut label = vec![
            Label {
                key: keys[0],
                str: name,
                ..Default::default()
            },
            Label {
                key: keys[1],
                num: i64::from(p.key.pid.0),
                ..Default::default()
            },
        ];
        if p.key.generation != 0 {
            label.push(Label {
                key: keys[2],
                num: i64::from(p.key.generation),
                ..Default::default()
            });
        }
        for s in &p.stacks {
            let value = rounding.round(&s.totals);
            if value.iter().all(|&v| v == 0) {
                continue;
            }
            let stack = t.shared_stack(&s.frames, p.build_ids.as_ref());
            samples.push(Sample {
                location_id: t.stacks[stack].iter().map(|&l| id(l)).collect(),
                value,
                label: label.clone(),
            });
        }
    }
    let comment = comments(profile)
        .iter()
        .map(|c| string(&mut t, c))
        .collect();
    let period_type = ValueType {
        r#type: string(&mut t, "space"),
        unit: string(&mut t, "bytes"),
    };
    let default_sample_type = string(&mut t, "inuse_space");
    let (mapping, location, function) = pprof_tables(&mut t);
    proto::Profile {
        sample_type,
        sample: samples,
        mapping,
        location,
        function,
        string_table: t.strings,
        time_nanos,
        duration_nanos: i64::try_from(profile.elapsed.as_nanos()).unwrap_or(i64::MAX),
        period_type: Some(period_type),
        // The rate most processes sampled at (Go's MemProfileRate has the
        // same meaning and the same default, 512 KiB).
        period: common_rate(profile) as i64,
        comment,
        default_sample_type,
        ..Default::default()
    }
}

/// A string's index in pprof's table.
fn string(t: &mut Tables, s: &str) -> i64 {
    t.string(s) as i64
}

/// A table entry's pprof id: its position + 1 (0 is none).
fn id(index: usize) -> u64 {
    index as u64 + 1
}

/// The tables as pprof's messages (locations at address 0: every one
/// carries its lines).
fn pprof_tables(t: &mut Tables) -> (Vec<Mapping>, Vec<Location>, Vec<Function>) {
    // Build ids join the string table first (none: "").
    let build_ids: Vec<i64> = (0..t.mappings.len())
        .map(|i| {
            let build_id = t.mappings[i].build_id.clone().unwrap_or_default();
            string(t, &build_id)
        })
        .collect();
    let mapping = t
        .mappings
        .iter()
        .zip(build_ids)
        .enumerate()
        .map(|(i, (m, build_id))| Mapping {
            id: id(i),
            filename: m.path as i64,
            build_id,
            // Every location carries its function name (unknown code is
            // named `file+offset`): nothing is left for pprof to
            // symbolize, so it never goes looking for binaries.
            has_functions: true,
            has_filenames: m.has_filenames,
            has_line_numbers: m.has_line_numbers,
            has_inline_frames: m.has_inline_frames,
            ..Default::default()
        })
        .collect();
    let location = t
        .locations
        .iter()
        .enumerate()
        .map(|(i, l)| Location {
            id: id(i),
            mapping_id: l.mapping.map_or(0, id),
            address: 0,
            line: l
                .lines
                .iter()
                .map(|line| Line {
                    function_id: id(line.function),
                    line: line.line,
                    column: 0,
                })
                .collect(),
            is_folded: false,
        })
        .collect();
    let function = t
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| Function {
            id: id(i),
            name: f.name as i64,
            system_name: f.name as i64,
            filename: f.file as i64,
            start_line: 0,
        })
        .collect();
    (mapping, location, function)
}

/// The executable a stack runs in: the module of its outermost frame that
/// is not a shared library (stack walks often end in libc's start code).
fn executable(frames: &[Frame]) -> Option<&str> {
    let is_library = |m: &str| {
        let name = m.rsplit('/').next().unwrap_or(m);
        name.ends_with(".so") || name.contains(".so.")
    };
    let mut modules = frames.iter().rev().filter_map(|f| f.module.as_deref());
    let outermost = modules.clone().next();
    modules.find(|m| !is_library(m)).or(outermost)
}

/// Human-readable notes, shown by `go tool pprof -comments`.
fn comments(profile: &Profile) -> Vec<String> {
    let mut out = vec![format!(
        "allocprof {}: unbiased estimates from per-byte sampling; {:.1} s",
        env!("CARGO_PKG_VERSION"),
        profile.elapsed.as_secs_f64()
    )];
    for p in &profile.processes {
        out.push(format!(
            "{} [{}]: live {} ± {} (95% CI), {} sampled allocations, rate {} B, {} dropped",
            p.label(),
            p.state.describe(),
            human_bytes(p.totals.live_bytes),
            human_ci(p.totals.live_ci95()),
            p.totals.alloc_samples,
            p.rate,
            p.dropped()
        ));
    }
    for reason in DropReason::ALL
        .into_iter()
        .filter(|&r| crate::model::profile::is_loss(r))
    {
        let n = profile.drops[reason as usize];
        if n > 0 {
            out.push(format!("dropped: {n} ({})", reason.describe()));
        }
    }
    if profile.unmatched_frees() > 0 {
        out.push(format!(
            "unmatched frees: {} (blocks sampled before allocprof saw them: nothing lost)",
            profile.unmatched_frees()
        ));
    }
    out
}

fn common_rate(profile: &Profile) -> u64 {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for p in &profile.processes {
        *counts.entry(p.rate).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(rate, n)| (n, rate))
        .map_or(512 * 1024, |(rate, _)| rate)
}

/// Rounds each sample so that the running sums stay the rounded running sums
/// of the estimates: the file's totals then equal allocprof's (rounded)
/// totals exactly, rather than drifting by half a unit per stack.
#[derive(Default)]
struct Rounding {
    exact: [f64; 4],
    written: [i64; 4],
}

impl Rounding {
    fn round(&mut self, t: &Totals) -> Vec<i64> {
        let values = [t.alloc_objects, t.alloc_bytes, t.live_objects, t.live_bytes];
        (0..4)
            .map(|i| {
                self.exact[i] += values[i];
                let target = self.exact[i].round() as i64;
                let v = target - self.written[i];
                self.written[i] = target;
                v
            })
            .collect()
    }
}
