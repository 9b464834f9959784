//! The encoder: a [`Profile`] as a Go-shaped heap `profile.proto`.

use std::{
    collections::{BTreeMap, HashMap},
    io::Write,
    path::Path,
};

use flate2::{Compression, write::GzEncoder};
use profiler_common::DropReason;
use prost::Message;

use super::{
    LABEL_GENERATION, LABEL_PID, LABEL_PROCESS, SAMPLE_TYPES,
    proto::{self, Function, Label, Line, Location, Mapping, Sample, ValueType},
};
use crate::{
    model::profile::{BuildIds, Profile},
    model::stats::{Totals, human_bytes, human_ci},
    output::export::build_id::build_id,
    symbolize::{Frame, PYTHON_MODULE},
};

/// The profile as a gzip'd `profile.proto`.
pub fn render(profile: &Profile, time_nanos: i64) -> Vec<u8> {
    let bytes = to_proto(profile, time_nanos).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&bytes).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

/// Builds the `profile.proto` message.
pub(crate) fn to_proto(profile: &Profile, time_nanos: i64) -> proto::Profile {
    let mut b = Builder::default();
    b.strings.get(""); // index 0 is ""
    let sample_type = SAMPLE_TYPES
        .iter()
        .map(|(t, u)| ValueType {
            r#type: b.strings.get(t),
            unit: b.strings.get(u),
        })
        .collect();
    // Executables first: pprof takes the first mapping for the main binary.
    for p in &profile.processes {
        if let Some(module) = p.stacks.iter().find_map(|s| executable(&s.frames)) {
            b.mapping(module, p.build_ids.as_deref());
        }
    }
    let keys = [LABEL_PROCESS, LABEL_PID, LABEL_GENERATION].map(|k| b.strings.get(k));
    let mut rounding = Rounding::default();
    let mut samples = Vec::new();
    for p in &profile.processes {
        let name = b.strings.get(&p.name);
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
            let location_id = b.locations(&s.frames, p.build_ids.as_deref());
            samples.push(Sample {
                location_id,
                value,
                label: label.clone(),
            });
        }
    }
    let comment = comments(profile).iter().map(|c| b.strings.get(c)).collect();
    let period_type = ValueType {
        r#type: b.strings.get("space"),
        unit: b.strings.get("bytes"),
    };
    let default_sample_type = b.strings.get("inuse_space");
    let mapping = b.finish_mappings();
    proto::Profile {
        sample_type,
        sample: samples,
        mapping,
        location: b.locations,
        function: b.functions,
        string_table: b.strings.table,
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

#[derive(Default)]
struct Strings {
    index: HashMap<String, i64>,
    table: Vec<String>,
}

impl Strings {
    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

#[derive(Default)]
struct ModuleInfo {
    id: u64,
    /// Its GNU build id (hex), if it has one.
    build_id: Option<String>,
    has_filenames: bool,
    has_line_numbers: bool,
    has_inline_frames: bool,
}

#[derive(Default)]
struct Builder {
    strings: Strings,
    /// By file path, in first-seen order (ids are 1-based positions).
    modules: Vec<(String, ModuleInfo)>,
    /// By path and build id: one path may name different files in
    /// different processes (containers, a library upgraded in place).
    module_ids: HashMap<(String, Option<String>), usize>,
    functions: Vec<Function>,
    function_ids: HashMap<(String, String), u64>,
    locations: Vec<Location>,
    location_ids: HashMap<(Vec<Frame>, u64), u64>,
}

impl Builder {
    /// The mapping of file `module`; its build id read from the files the
    /// process mapped (`ids`), or from the path where those are unknown.
    fn mapping(&mut self, module: &str, ids: Option<&BuildIds>) -> usize {
        let build_id = match ids {
            Some(ids) => ids.get(module).map(|id| id.to_string()),
            // Python code's mapping is no file.
            None if module == PYTHON_MODULE => None,
            None => build_id(Path::new(module)),
        };
        let key = (module.to_owned(), build_id);
        if let Some(&i) = self.module_ids.get(&key) {
            return i;
        }
        let i = self.modules.len();
        let info = ModuleInfo {
            id: i as u64 + 1,
            build_id: key.1.clone(),
            ..Default::default()
        };
        self.modules.push((module.to_owned(), info));
        self.module_ids.insert(key, i);
        i
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (name.to_owned(), file.to_owned());
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name = self.strings.get(name);
        let filename = self.strings.get(file);
        self.functions.push(Function {
            id,
            name,
            system_name: name,
            filename,
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }

    /// Location ids of a stack, innermost first: each machine frame with the
    /// frames inlined into it (which precede it in `frames`).
    fn locations(&mut self, frames: &[Frame], ids: Option<&BuildIds>) -> Vec<u64> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, f) in frames.iter().enumerate() {
            if f.inlined && i + 1 < frames.len() {
                continue;
            }
            out.push(self.location(&frames[start..=i], ids));
            start = i + 1;
        }
        out
    }

    fn location(&mut self, chain: &[Frame], ids: Option<&BuildIds>) -> u64 {
        let outer = chain.last().expect("a location has a frame");
        let mapping = outer.module.as_deref().map(|m| self.mapping(m, ids));
        let known = mapping.map_or(0, |i| self.modules[i].1.id);
        if let Some(&id) = self.location_ids.get(&(chain.to_vec(), known)) {
            return id;
        }
        let mapping_id = match mapping {
            Some(i) => {
                let info = &mut self.modules[i].1;
                info.has_inline_frames |= chain.len() > 1;
                for f in chain {
                    let (file, line) = split_location(f.location.as_deref());
                    info.has_filenames |= !file.is_empty();
                    info.has_line_numbers |= line != 0;
                }
                info.id
            }
            None => 0,
        };
        let line = chain
            .iter()
            .map(|f| {
                let (file, line) = split_location(f.location.as_deref());
                Line {
                    function_id: self.function(&f.function, file),
                    line,
                    column: 0,
                }
            })
            .collect();
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id,
            address: 0,
            line,
            is_folded: false,
        });
        self.location_ids.insert((chain.to_vec(), mapping_id), id);
        id
    }

    fn finish_mappings(&mut self) -> Vec<Mapping> {
        let modules = std::mem::take(&mut self.modules);
        modules
            .into_iter()
            .map(|(path, info)| {
                let id = info.build_id.unwrap_or_default();
                Mapping {
                    id: info.id,
                    filename: self.strings.get(&path),
                    build_id: self.strings.get(&id),
                    // Every location carries its function name (unknown code
                    // is named `file+offset`): nothing is left for pprof to
                    // symbolize, so it never goes looking for binaries.
                    has_functions: true,
                    has_filenames: info.has_filenames,
                    has_line_numbers: info.has_line_numbers,
                    has_inline_frames: info.has_inline_frames,
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// `file:line` → (file, line); a location without a line number → (it, 0).
pub(super) fn split_location(location: Option<&str>) -> (&str, i64) {
    let Some(loc) = location else {
        return ("", 0);
    };
    match loc.rsplit_once(':') {
        Some((file, line)) => match line.parse::<i64>() {
            Ok(n) if n > 0 => (file, n),
            _ => (loc, 0),
        },
        None => (loc, 0),
    }
}
