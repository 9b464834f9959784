//! pprof export: a gzip'd `profile.proto` shaped like a Go heap profile, so
//! `go tool pprof`, Pyroscope, Parca, Speedscope and friends open it as is.
//!
//! - Sample types, in Go's order: `alloc_objects/count`, `alloc_space/bytes`,
//!   `inuse_objects/count`, `inuse_space/bytes` (the default). Values are
//!   allocprof's unbiased estimates (no further scaling is to be applied),
//!   rounded so that the sum over all samples equals the rounded total.
//! - One sample per process image and stack, labelled `process` (name),
//!   `pid` and, after an exec, `generation`.
//! - One location per distinct symbolized frame chain: a machine frame and
//!   the functions inlined into it (lines innermost first). Addresses are 0:
//!   frames are merged across processes by what they symbolize to, so no
//!   single address would be true.
//! - One mapping per file, with its GNU build id.
//!
//! [`decode`] reads such files back (and Go heap profiles) for `allocprof diff`.

pub mod proto;

use std::{
    collections::{BTreeMap, HashMap},
    io::{Read, Write},
    path::Path,
    sync::Arc,
    time::Duration,
};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use profiler_common::{DROP_REASONS, DropReason};
use prost::Message;
use thiserror::Error;

use self::proto::{Function, Label, Line, Location, Mapping, Sample, ValueType};
use super::build_id::build_id;
use crate::{
    profile::{ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile, sort_processes},
    stats::{Totals, human_bytes, human_ci},
    symbolize::{Frame, Name},
};

/// Go's heap-profile sample types, in Go's order.
pub(crate) const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

const LABEL_PROCESS: &str = "process";
const LABEL_PID: &str = "pid";
const LABEL_GENERATION: &str = "generation";

/// What [`decode`] accepts at most. Each bound gives its own error, checked
/// before the work it bounds, so that a crafted file costs bounded memory and
/// time. The defaults are far above any real heap profile (allocprof's are a
/// few MiB and a few thousand samples).
///
/// Nesting needs no bound of its own: `profile.proto` has no recursive
/// message (Profile → Location → Line is the deepest chain), and prost
/// refuses groups nested deeper than its recursion limit (100) in the
/// unknown fields it skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of `profile.proto`, after decompression (and of the file).
    pub bytes: u64,
    pub samples: usize,
    pub locations: usize,
    pub functions: usize,
    pub mappings: usize,
    pub strings: usize,
    /// Lines of one location: a machine frame and the frames inlined into it.
    pub lines_per_location: usize,
    pub labels_per_sample: usize,
    /// Location ids of one sample.
    pub stack_depth: usize,
    /// Frames of all samples together, inlined ones included: what decoding
    /// copies, so what bounds its time.
    pub frames: usize,
}

/// Default bound on a profile's uncompressed bytes. 64 MiB, not more: prost
/// decodes the whole message at once, and a crafted message costs many times
/// its bytes once decoded (a 2-byte empty `Sample` becomes 72 bytes in a
/// `Vec`, plus growth). What the message would take decoded is therefore
/// estimated from the wire first (Vec growth counted at its worst) and
/// bounded to [`DECODED_PER_BYTE`] times this, 1 GiB: real profiles are
/// estimated at under 8 times their bytes, while crafted ones (empty labels,
/// lines, samples) would reach 32 to 72 times. Measured: a crafted 40 MB
/// message of empty lines just within the estimate peaks at 650 MB RSS.
/// `allocprof diff --max-profile-bytes` raises both.
pub const MAX_PROFILE_BYTES: u64 = 64 << 20;

/// What decoding may take, in bytes of memory per byte of the size limit.
pub(crate) const DECODED_PER_BYTE: u64 = 16;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            bytes: MAX_PROFILE_BYTES,
            samples: 1_000_000,
            locations: 1_000_000,
            functions: 1_000_000,
            mappings: 100_000,
            strings: 4_000_000,
            lines_per_location: 256,
            labels_per_sample: 64,
            stack_depth: 4096,
            frames: 16_000_000,
        }
    }
}

#[derive(Debug, Error)]
pub enum DecodeError {
    #[error(
        "larger than {} uncompressed (the limit); --max-profile-bytes raises it",
        size(*.0)
    )]
    TooLarge(u64),
    #[error(
        "would take more than {} once decoded (the limit, {DECODED_PER_BYTE} times \
         --max-profile-bytes, which raises it)",
        size(*.0)
    )]
    TooLargeDecoded(u64),
    #[error("more than {0} samples (the limit)")]
    TooManySamples(usize),
    #[error("more than {0} locations (the limit)")]
    TooManyLocations(usize),
    #[error("more than {0} functions (the limit)")]
    TooManyFunctions(usize),
    #[error("more than {0} mappings (the limit)")]
    TooManyMappings(usize),
    #[error("more than {0} strings (the limit)")]
    TooManyStrings(usize),
    #[error("a location has more than {0} lines (the limit)")]
    TooManyLines(usize),
    #[error("a sample has more than {0} labels (the limit)")]
    TooManyLabels(usize),
    #[error("a sample has more than {0} locations (the stack depth limit)")]
    TooDeep(usize),
    #[error("more than {0} frames in all stacks together (the limit)")]
    TooManyFrames(usize),
    #[error("cannot decompress: {0}")]
    Gzip(#[source] std::io::Error),
    #[error("not a pprof profile")]
    Wire(#[from] prost::DecodeError),
    #[error("not a heap profile: no sample type {0}")]
    NotHeap(&'static str),
    #[error("malformed pprof profile: {0}")]
    Invalid(String),
}

/// `64 MiB` for whole MiB (as the limit is usually given), else `1.5 KiB`.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => human_bytes(b as f64),
    }
}

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
            b.mapping(module);
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
                num: i64::from(p.key.pid),
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
            let location_id = b.locations(&s.frames);
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
        .filter(|&r| crate::profile::is_loss(r))
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
    has_filenames: bool,
    has_line_numbers: bool,
    has_inline_frames: bool,
}

#[derive(Default)]
struct Builder {
    strings: Strings,
    /// By file path, in first-seen order (ids are 1-based positions).
    modules: Vec<(String, ModuleInfo)>,
    module_ids: HashMap<String, usize>,
    functions: Vec<Function>,
    function_ids: HashMap<(String, String), u64>,
    locations: Vec<Location>,
    location_ids: HashMap<Vec<Frame>, u64>,
}

impl Builder {
    fn mapping(&mut self, module: &str) -> usize {
        if let Some(&i) = self.module_ids.get(module) {
            return i;
        }
        let i = self.modules.len();
        let info = ModuleInfo {
            id: i as u64 + 1,
            ..Default::default()
        };
        self.modules.push((module.to_owned(), info));
        self.module_ids.insert(module.to_owned(), i);
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
    fn locations(&mut self, frames: &[Frame]) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut start = 0;
        for (i, f) in frames.iter().enumerate() {
            if f.inlined && i + 1 < frames.len() {
                continue;
            }
            ids.push(self.location(&frames[start..=i]));
            start = i + 1;
        }
        ids
    }

    fn location(&mut self, chain: &[Frame]) -> u64 {
        if let Some(&id) = self.location_ids.get(chain) {
            return id;
        }
        let outer = chain.last().expect("a location has a frame");
        let mapping_id = match &outer.module {
            Some(module) => {
                let i = self.mapping(module);
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
        self.location_ids.insert(chain.to_vec(), id);
        id
    }

    fn finish_mappings(&mut self) -> Vec<Mapping> {
        let modules = std::mem::take(&mut self.modules);
        modules
            .into_iter()
            .map(|(path, info)| {
                let id = build_id(Path::new(&path)).unwrap_or_default();
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
fn split_location(location: Option<&str>) -> (&str, i64) {
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

// ---------------------------------------------------------------- decoding

/// Reads a pprof heap profile (gzip'd or not), as allocprof writes them, or
/// as Go's runtime does (one process, named after the main mapping), within
/// the default [`Limits`].
pub fn decode(bytes: &[u8]) -> Result<Profile, DecodeError> {
    decode_with(bytes, &Limits::default())
}

/// [`decode`] within the given limits.
pub fn decode_with(bytes: &[u8], limits: &Limits) -> Result<Profile, DecodeError> {
    // The file too: a compressed file over the limit decompresses to more.
    if bytes.len() as u64 > limits.bytes {
        return Err(DecodeError::TooLarge(limits.bytes));
    }
    let raw;
    let data = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        // One byte over the limit tells a file at the limit from a bomb.
        GzDecoder::new(bytes)
            .take(limits.bytes.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(DecodeError::Gzip)?;
        raw = out;
        &raw[..]
    } else {
        bytes
    };
    if data.len() as u64 > limits.bytes {
        return Err(DecodeError::TooLarge(limits.bytes));
    }
    prescan(data, limits)?;
    from_proto(&proto::Profile::decode(data)?, limits)
}

/// Counts, from the wire, what prost would allocate for `data`, and fails on
/// the first count over its limit before prost allocates any of it. Stops
/// quietly at malformed bytes, where prost will stop too (with an error);
/// groups are left to prost's recursion limit. Returns the estimated bytes
/// of the decoded message.
fn prescan(data: &[u8], limits: &Limits) -> Result<u64, DecodeError> {
    use std::mem::size_of;
    #[derive(Clone, Copy)]
    enum Msg {
        Profile,
        Sample,
        Location,
    }
    #[derive(Default)]
    struct Counts {
        samples: usize,
        locations: usize,
        functions: usize,
        mappings: usize,
        strings: usize,
        /// Bytes the decoded message would take, Vec growth included.
        memory: u64,
    }
    fn walk(mut buf: &[u8], msg: Msg, limits: &Limits, c: &mut Counts) -> Result<(), DecodeError> {
        let varint = |b: &mut &[u8]| prost::encoding::decode_varint(b).ok();
        // Vec capacity is at most twice its length.
        let elements = |n: u64, each: usize| n.saturating_mul(2 * each as u64);
        let (mut lines, mut labels, mut ids) = (0usize, 0usize, 0usize);
        while !buf.is_empty() {
            let Some(key) = varint(&mut buf) else {
                return Ok(());
            };
            let (field, wire_type) = (key >> 3, key & 7);
            let scalar = match (msg, field) {
                (Msg::Profile, 13) | (Msg::Sample, 1 | 2) => Some(field),
                _ => None,
            };
            let payload = match wire_type {
                0 => {
                    if varint(&mut buf).is_none() {
                        return Ok(());
                    }
                    if let Some(field) = scalar {
                        c.memory = c.memory.saturating_add(elements(1, 8));
                        ids += usize::from(matches!(msg, Msg::Sample) && field == 1);
                    }
                    continue;
                }
                1 | 5 => {
                    let skip = if wire_type == 1 { 8 } else { 4 };
                    let Some(rest) = buf.get(skip..) else {
                        return Ok(());
                    };
                    buf = rest;
                    continue;
                }
                2 => {
                    let Some(len) = varint(&mut buf).and_then(|n| usize::try_from(n).ok()) else {
                        return Ok(());
                    };
                    if len > buf.len() {
                        return Ok(());
                    }
                    let (payload, rest) = buf.split_at(len);
                    buf = rest;
                    payload
                }
                _ => return Ok(()),
            };
            if let Some(field) = scalar {
                // Packed: one element per varint, i.e. per byte < 0x80.
                let n = payload.iter().filter(|&&b| b < 0x80).count();
                c.memory = c.memory.saturating_add(elements(n as u64, 8));
                if matches!(msg, Msg::Sample) && field == 1 {
                    ids += n;
                }
                continue;
            }
            let each = match (msg, field) {
                (Msg::Profile, 1) => size_of::<ValueType>(),
                (Msg::Profile, 2) => {
                    c.samples += 1;
                    walk(payload, Msg::Sample, limits, c)?;
                    size_of::<Sample>()
                }
                (Msg::Profile, 3) => {
                    c.mappings += 1;
                    size_of::<Mapping>()
                }
                (Msg::Profile, 4) => {
                    c.locations += 1;
                    walk(payload, Msg::Location, limits, c)?;
                    size_of::<Location>()
                }
                (Msg::Profile, 5) => {
                    c.functions += 1;
                    size_of::<Function>()
                }
                (Msg::Profile, 6) => {
                    c.strings += 1;
                    size_of::<String>() + payload.len()
                }
                (Msg::Sample, 3) => {
                    labels += 1;
                    size_of::<Label>()
                }
                (Msg::Location, 4) => {
                    lines += 1;
                    size_of::<Line>()
                }
                _ => 0,
            };
            c.memory = c.memory.saturating_add(elements(1, each));
        }
        if lines > limits.lines_per_location {
            return Err(DecodeError::TooManyLines(limits.lines_per_location));
        }
        if labels > limits.labels_per_sample {
            return Err(DecodeError::TooManyLabels(limits.labels_per_sample));
        }
        if ids > limits.stack_depth {
            return Err(DecodeError::TooDeep(limits.stack_depth));
        }
        Ok(())
    }
    let mut c = Counts::default();
    walk(data, Msg::Profile, limits, &mut c)?;
    if c.samples > limits.samples {
        return Err(DecodeError::TooManySamples(limits.samples));
    }
    if c.locations > limits.locations {
        return Err(DecodeError::TooManyLocations(limits.locations));
    }
    if c.functions > limits.functions {
        return Err(DecodeError::TooManyFunctions(limits.functions));
    }
    if c.mappings > limits.mappings {
        return Err(DecodeError::TooManyMappings(limits.mappings));
    }
    if c.strings > limits.strings {
        return Err(DecodeError::TooManyStrings(limits.strings));
    }
    let memory = limits.bytes.saturating_mul(DECODED_PER_BYTE);
    if c.memory > memory {
        return Err(DecodeError::TooLargeDecoded(memory));
    }
    Ok(c.memory)
}

/// Fails on the first of the message's counts over its limit.
fn check_counts(p: &proto::Profile, limits: &Limits) -> Result<(), DecodeError> {
    let over = |n: usize, limit: usize| n > limit;
    if over(p.sample.len(), limits.samples) {
        return Err(DecodeError::TooManySamples(limits.samples));
    }
    if over(p.location.len(), limits.locations) {
        return Err(DecodeError::TooManyLocations(limits.locations));
    }
    if over(p.function.len(), limits.functions) {
        return Err(DecodeError::TooManyFunctions(limits.functions));
    }
    if over(p.mapping.len(), limits.mappings) {
        return Err(DecodeError::TooManyMappings(limits.mappings));
    }
    if over(p.string_table.len(), limits.strings) {
        return Err(DecodeError::TooManyStrings(limits.strings));
    }
    if p.location
        .iter()
        .any(|l| over(l.line.len(), limits.lines_per_location))
    {
        return Err(DecodeError::TooManyLines(limits.lines_per_location));
    }
    for s in &p.sample {
        if over(s.label.len(), limits.labels_per_sample) {
            return Err(DecodeError::TooManyLabels(limits.labels_per_sample));
        }
        if over(s.location_id.len(), limits.stack_depth) {
            return Err(DecodeError::TooDeep(limits.stack_depth));
        }
    }
    Ok(())
}

/// The profile a decoded message describes, once it is checked against
/// `limits` and every reference in it resolves.
pub(crate) fn from_proto(p: &proto::Profile, limits: &Limits) -> Result<Profile, DecodeError> {
    check_counts(p, limits)?;
    let string = |i: i64| -> Result<&str, DecodeError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| DecodeError::Invalid(format!("string index {i} out of range")))
    };
    if p.string_table.first().is_some_and(|s| !s.is_empty()) {
        return Err(DecodeError::Invalid("string_table[0] is not empty".into()));
    }
    // Where each of our quantities is among the file's sample types.
    let mut index = [0usize; 4];
    for (slot, (name, _)) in index.iter_mut().zip(SAMPLE_TYPES) {
        *slot = p
            .sample_type
            .iter()
            .map(|t| string(t.r#type))
            .position(|t| t.is_ok_and(|t| t == name))
            .ok_or(DecodeError::NotHeap(name))?;
    }
    let mut functions = HashMap::new();
    for f in &p.function {
        functions.insert(f.id, (string(f.name)?, string(f.filename)?));
    }
    let mut mappings = HashMap::new();
    for m in &p.mapping {
        mappings.insert(m.id, string(m.filename)?);
    }
    let mut locations: HashMap<u64, Vec<Frame>> = HashMap::new();
    for l in &p.location {
        let module = match l.mapping_id {
            0 => None,
            id => Some(
                mappings
                    .get(&id)
                    .ok_or_else(|| {
                        DecodeError::Invalid(format!("location {} has no mapping {id}", l.id))
                    })?
                    .to_string()
                    .into(),
            ),
        };
        let mut frames = Vec::with_capacity(l.line.len());
        for (i, line) in l.line.iter().enumerate() {
            let (name, file) = functions.get(&line.function_id).ok_or_else(|| {
                DecodeError::Invalid(format!(
                    "location {} has no function {}",
                    l.id, line.function_id
                ))
            })?;
            let location = match (file.is_empty(), line.line) {
                (true, _) => None,
                (false, n) if n > 0 => Some(format!("{file}:{n}")),
                (false, _) => Some(file.to_string()),
            };
            frames.push(Frame {
                function: (*name).into(),
                location: location.map(Name::from),
                module: module.clone(),
                inlined: i + 1 < l.line.len(),
            });
        }
        if frames.is_empty() {
            // Unsymbolized (e.g. a raw Go profile): name it by address.
            frames.push(Frame {
                function: format!("[unknown {:#x}]", l.address).into(),
                location: None,
                module,
                inlined: false,
            });
        }
        locations.insert(l.id, frames);
    }
    let main_binary = p
        .mapping
        .first()
        .and_then(|m| string(m.filename).ok())
        .and_then(|f| Path::new(f).file_name())
        .map_or("profile".to_string(), |n| n.to_string_lossy().into_owned());

    struct Proc {
        name: String,
        stacks: HashMap<Arc<[Frame]>, Totals>,
    }
    let mut processes: BTreeMap<ProcessKey, Proc> = BTreeMap::new();
    let mut frame_budget = limits.frames;
    for s in &p.sample {
        if s.value.len() != p.sample_type.len() {
            return Err(DecodeError::Invalid(format!(
                "a sample has {} values for {} sample types",
                s.value.len(),
                p.sample_type.len()
            )));
        }
        let mut key = ProcessKey {
            pid: 0,
            generation: 0,
        };
        let mut name = None;
        for l in &s.label {
            match string(l.key)? {
                LABEL_PROCESS => name = Some(string(l.str)?.to_string()),
                LABEL_PID => key.pid = u32::try_from(l.num).unwrap_or(0),
                LABEL_GENERATION => key.generation = u32::try_from(l.num).unwrap_or(0),
                _ => {}
            }
        }
        let mut frames = Vec::new();
        for id in &s.location_id {
            let chain = locations.get(id).ok_or_else(|| {
                DecodeError::Invalid(format!("a sample refers to no location {id}"))
            })?;
            // Counted before copying: a few bytes of location ids can name
            // long inline chains many times over.
            frame_budget = frame_budget
                .checked_sub(chain.len())
                .ok_or(DecodeError::TooManyFrames(limits.frames))?;
            frames.extend(chain.iter().cloned());
        }
        let v = |i: usize| s.value[index[i]] as f64;
        let totals = Totals {
            alloc_objects: v(0),
            alloc_bytes: v(1),
            live_objects: v(2),
            live_bytes: v(3),
            ..Default::default()
        };
        let proc = processes.entry(key).or_insert_with(|| Proc {
            name: name.clone().unwrap_or_else(|| main_binary.clone()),
            stacks: HashMap::new(),
        });
        *proc.stacks.entry(frames.into()).or_default() += totals;
    }
    let rate = u64::try_from(p.period).unwrap_or(0);
    let mut out: Vec<ProcessProfile> = processes
        .into_iter()
        .map(|(key, proc)| {
            let stacks = proc
                .stacks
                .into_iter()
                .map(|(frames, totals)| StackProfile { frames, totals })
                .collect();
            ProcessProfile::from_stacks(key, proc.name, ProcessState::Live, rate, stacks)
        })
        .collect();
    sort_processes(&mut out);
    Ok(Profile {
        processes: out,
        drops: [0; DROP_REASONS],
        elapsed: Duration::from_nanos(u64::try_from(p.duration_nanos).unwrap_or(0)),
        unwind: Default::default(),
        min_age: Duration::ZERO,
        attached_at: None,
        ran_before_attach: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::export::tests::{frame, hand_made};

    fn decoded(profile: &Profile) -> Profile {
        decode(&render(profile, 1)).unwrap()
    }

    #[test]
    fn round_trip_keeps_processes_stacks_frames_and_values() {
        let profile = hand_made();
        let back = decoded(&profile);
        assert_eq!(back.processes.len(), profile.processes.len());
        for (a, b) in profile.processes.iter().zip(&back.processes) {
            assert_eq!((a.key, &a.name), (b.key, &b.name));
            assert_eq!(a.stacks.len(), b.stacks.len());
            for (sa, sb) in a.stacks.iter().zip(&b.stacks) {
                assert_eq!(sa.frames, sb.frames, "frames survive, inlining included");
                // Values are whole bytes and objects in the file.
                assert!((sa.totals.live_bytes - sb.totals.live_bytes).abs() <= 1.0);
                assert!((sa.totals.alloc_objects - sb.totals.alloc_objects).abs() <= 1.0);
            }
        }
        assert_eq!(back.elapsed, profile.elapsed);
        assert_eq!(back.processes[0].rate, 65_536);
    }

    #[test]
    fn totals_are_the_rounded_totals() {
        let profile = hand_made();
        let p = to_proto(&profile, 0);
        let sum = |i: usize| p.sample.iter().map(|s| s.value[i]).sum::<i64>();
        let t = profile.totals();
        assert_eq!(sum(0), t.alloc_objects.round() as i64);
        assert_eq!(sum(1), t.alloc_bytes.round() as i64);
        assert_eq!(sum(2), t.live_objects.round() as i64);
        assert_eq!(sum(3), t.live_bytes.round() as i64);
    }

    #[test]
    fn go_heap_profile_shape() {
        let p = to_proto(&hand_made(), 0);
        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, SAMPLE_TYPES);
        assert_eq!(s(p.default_sample_type), "inuse_space");
        let period = p.period_type.unwrap();
        assert_eq!((s(period.r#type), s(period.unit)), ("space", "bytes"));
        assert_eq!(p.string_table[0], "");
        // The executable, not libc's start code, is the first mapping.
        assert_eq!(s(p.mapping[0].filename), "/usr/bin/demo");
        assert!(p.mapping.iter().all(|m| m.has_functions));
        // The inlined frame shares a location with its caller, innermost first.
        let inlined = p.location.iter().find(|l| l.line.len() == 2).unwrap();
        let names: Vec<_> = inlined
            .line
            .iter()
            .map(|l| s(p.function[l.function_id as usize - 1].name))
            .collect();
        assert_eq!(names, ["inlined_helper", "site_large"]);
        assert_eq!(inlined.line[1].line, 42);
    }

    #[test]
    fn mappings_carry_build_ids() {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        let mut profile = hand_made();
        let mut f = frame("main", Some(exe));
        f.location = Some("main.rs:3".into());
        profile.processes[0].stacks[0].frames = vec![f].into();
        let p = to_proto(&profile, 0);
        let m = p
            .mapping
            .iter()
            .find(|m| p.string_table[m.filename as usize] == exe)
            .unwrap();
        assert_eq!(
            p.string_table[m.build_id as usize],
            build_id(Path::new(exe)).unwrap()
        );
        assert!(m.has_filenames && m.has_line_numbers);
    }

    #[test]
    fn decompression_bombs_are_refused_before_decoding() {
        // 80 MiB of empty sample_type fields, gzip'd to well under 1 MiB:
        // decoded, each pair would become a ValueType.
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        let chunk = [0x0a_u8, 0x00].repeat(1 << 20);
        for _ in 0..40 {
            gz.write_all(&chunk).unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{}", bomb.len());
        assert!(matches!(
            decode(&bomb),
            Err(DecodeError::TooLarge(MAX_PROFILE_BYTES))
        ));
        // Uncompressed, the same limit holds.
        let raw = vec![0u8; (MAX_PROFILE_BYTES + 1) as usize];
        assert!(matches!(decode(&raw), Err(DecodeError::TooLarge(_))));
        // And it can be raised (or lowered).
        let small = Limits {
            bytes: 1000,
            ..Default::default()
        };
        let file = render(&hand_made(), 1);
        assert!(file.len() < 1000);
        assert!(matches!(
            decode_with(&file, &small),
            Err(DecodeError::TooLarge(1000))
        ));
        assert_eq!(
            DecodeError::TooLarge(MAX_PROFILE_BYTES).to_string(),
            "larger than 64 MiB uncompressed (the limit); --max-profile-bytes raises it"
        );
    }

    /// The limits that `p` just fits in.
    fn tight(p: &proto::Profile) -> Limits {
        Limits {
            bytes: p.encoded_len() as u64,
            samples: p.sample.len(),
            locations: p.location.len(),
            functions: p.function.len(),
            mappings: p.mapping.len(),
            strings: p.string_table.len(),
            lines_per_location: p.location.iter().map(|l| l.line.len()).max().unwrap(),
            labels_per_sample: p.sample.iter().map(|s| s.label.len()).max().unwrap(),
            stack_depth: p.sample.iter().map(|s| s.location_id.len()).max().unwrap(),
            frames: decode(&p.encode_to_vec())
                .unwrap()
                .processes
                .iter()
                .flat_map(|p| &p.stacks)
                .map(|s| s.frames.len())
                .sum(),
        }
    }

    #[test]
    fn each_limit_is_its_own_error_one_past_it() {
        let p = to_proto(&hand_made(), 0);
        let bytes = p.encode_to_vec();
        let fits = tight(&p);
        assert!(decode_with(&bytes, &fits).is_ok());
        type Lower = fn(&mut Limits) -> &mut usize;
        type Is = fn(&DecodeError) -> bool;
        let cases: [(Lower, Is, &str); 9] = [
            (
                |l| &mut l.samples,
                |e| matches!(e, DecodeError::TooManySamples(_)),
                "samples",
            ),
            (
                |l| &mut l.locations,
                |e| matches!(e, DecodeError::TooManyLocations(_)),
                "locations",
            ),
            (
                |l| &mut l.functions,
                |e| matches!(e, DecodeError::TooManyFunctions(_)),
                "functions",
            ),
            (
                |l| &mut l.mappings,
                |e| matches!(e, DecodeError::TooManyMappings(_)),
                "mappings",
            ),
            (
                |l| &mut l.strings,
                |e| matches!(e, DecodeError::TooManyStrings(_)),
                "strings",
            ),
            (
                |l| &mut l.lines_per_location,
                |e| matches!(e, DecodeError::TooManyLines(_)),
                "lines",
            ),
            (
                |l| &mut l.labels_per_sample,
                |e| matches!(e, DecodeError::TooManyLabels(_)),
                "labels",
            ),
            (
                |l| &mut l.stack_depth,
                |e| matches!(e, DecodeError::TooDeep(_)),
                "stack depth",
            ),
            (
                |l| &mut l.frames,
                |e| matches!(e, DecodeError::TooManyFrames(_)),
                "frames",
            ),
        ];
        for (lower, is, name) in cases {
            let mut limits = fits;
            *lower(&mut limits) -= 1;
            let limit = *lower(&mut limits);
            let err = decode_with(&bytes, &limits).unwrap_err();
            assert!(is(&err), "{name}: {err}");
            let msg = err.to_string();
            assert!(msg.contains(&format!("more than {limit} ")), "{msg}");
            assert!(msg.contains(name) && msg.contains("limit"), "{msg}");
        }
    }

    #[test]
    fn default_limits_hold_against_crafted_counts() {
        // A million and one empty samples: 2 MiB on the wire.
        let p = proto::Profile {
            sample: vec![Sample::default(); 1_000_001],
            ..Default::default()
        };
        let err = decode(&p.encode_to_vec()).unwrap_err();
        assert_eq!(err.to_string(), "more than 1000000 samples (the limit)");
        // (The frame total is tried at a lower limit above: reaching the
        // default takes 16M frame copies, seconds in a debug build.)
    }

    #[test]
    fn decoded_size_is_bounded_before_prost_allocates() {
        // Samples of 64 empty labels, 2 wire bytes each: 32 bytes decoded,
        // 64 with Vec growth, so 600 KiB would take past 16 times 1 MiB.
        let p = proto::Profile {
            sample: vec![
                Sample {
                    label: vec![Label::default(); 64],
                    ..Default::default()
                };
                4800
            ],
            ..Default::default()
        };
        let limits = Limits {
            bytes: 1 << 20,
            ..Default::default()
        };
        let err = decode_with(&p.encode_to_vec(), &limits).unwrap_err();
        assert!(matches!(err, DecodeError::TooLargeDecoded(_)), "{err}");
        assert_eq!(
            err.to_string(),
            "would take more than 16 MiB once decoded (the limit, 16 times \
             --max-profile-bytes, which raises it)"
        );
        assert!(p.encoded_len() < 1 << 20);
        // Real profiles are estimated at a few times their bytes.
        let real = to_proto(&hand_made(), 0).encode_to_vec();
        let estimate = prescan(&real, &Limits::default()).unwrap();
        assert!(
            estimate < 8 * real.len() as u64,
            "{estimate} for {}",
            real.len()
        );
    }

    #[test]
    fn deep_nesting_is_refused_by_prost() {
        // profile.proto has no recursive message: depth comes only from
        // groups in unknown fields, which prost skips up to its limit.
        let nested = |depth: usize| {
            let mut b = Vec::new();
            b.extend([0xa3, 0x06].repeat(depth)); // field 100, start group
            b.extend([0xa4, 0x06].repeat(depth)); // field 100, end group
            b
        };
        // Shallow groups are skipped (then the profile is found empty).
        assert!(matches!(decode(&nested(10)), Err(DecodeError::NotHeap(_))));
        let err = decode(&nested(10_000)).unwrap_err();
        assert!(matches!(err, DecodeError::Wire(_)), "{err}");
        assert!(format!("{err:?}").contains("RecursionLimit"), "{err:?}");
    }

    #[test]
    fn dangling_references_are_errors() {
        let good = to_proto(&hand_made(), 0);
        type Corrupt = fn(&mut proto::Profile);
        let cases: [(Corrupt, &str); 5] = [
            (|p| p.sample[0].location_id[0] = 999, "no location 999"),
            (
                |p| p.location[0].line[0].function_id = 999,
                "no function 999",
            ),
            (|p| p.location[0].mapping_id = 999, "no mapping 999"),
            (
                |p| p.function[0].name = 9999,
                "string index 9999 out of range",
            ),
            (
                |p| p.sample[0].label[0].key = -1,
                "string index -1 out of range",
            ),
        ];
        for (corrupt, want) in cases {
            let mut p = good.clone();
            corrupt(&mut p);
            let err = decode(&p.encode_to_vec()).unwrap_err();
            assert!(matches!(err, DecodeError::Invalid(_)), "{err}");
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[test]
    fn garbage_is_a_clear_error() {
        assert!(matches!(decode(b"hello"), Err(DecodeError::Wire(_))));
        assert!(matches!(
            decode(&[0x1f, 0x8b, 1, 2, 3]),
            Err(DecodeError::Gzip(_))
        ));
        let cpu = proto::Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: ["", "samples", "count"].map(String::from).to_vec(),
            ..Default::default()
        };
        let err = decode(&cpu.encode_to_vec()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a heap profile: no sample type alloc_objects"
        );
    }

    /// Writes the pprof fuzz target's seeds into `$ALLOCPROF_FUZZ_SEEDS`, if
    /// set: a rendered profile, gzip'd and plain, and a Go-shaped one.
    #[test]
    fn fuzz_seeds() {
        let Some(dir) = std::env::var_os("ALLOCPROF_FUZZ_SEEDS") else {
            return;
        };
        let dir = Path::new(&dir);
        let profile = hand_made();
        std::fs::write(dir.join("seed-allocprof.pb.gz"), render(&profile, 1)).unwrap();
        let plain = to_proto(&profile, 1).encode_to_vec();
        std::fs::write(dir.join("seed-allocprof.pb"), plain).unwrap();
        // As Go writes them: unsymbolized locations, no labels.
        let mut go = to_proto(&profile, 1);
        go.function.clear();
        for l in &mut go.location {
            l.line.clear();
            l.address = 0x401000 + l.id * 16;
        }
        for s in &mut go.sample {
            s.label.clear();
        }
        std::fs::write(dir.join("seed-go.pb"), go.encode_to_vec()).unwrap();
    }

    #[test]
    fn locations_split_file_and_line() {
        assert_eq!(split_location(Some("/src/a.c:12")), ("/src/a.c", 12));
        assert_eq!(split_location(Some("/src/a.c")), ("/src/a.c", 0));
        assert_eq!(split_location(Some("C:x")), ("C:x", 0));
        assert_eq!(split_location(None), ("", 0));
    }

    /// A small arbitrary profile whose values are whole numbers (what the
    /// file keeps exactly) and whose stacks are distinct per process.
    fn arbitrary_profile() -> impl Strategy<Value = Profile> {
        let frame = (
            "[a-z_:<>]{0,8}",
            proptest::option::of(("[a-z/]{1,6}", 0u32..50)),
            proptest::option::of("/[a-z]{1,6}(\\.so)?"),
            any::<bool>(),
        )
            .prop_map(|(function, location, module, inlined)| Frame {
                function: function.into(),
                location: location.map(|(file, line)| match line {
                    0 => file.into(),
                    n => format!("{file}:{n}").into(),
                }),
                module: module.map(Name::from),
                inlined,
            });
        let stack = (
            proptest::collection::vec(frame, 0..6),
            [0u32..1000, 0u32..100_000, 0u32..1000, 1u32..100_000],
        )
            .prop_map(|(mut frames, values)| {
                // What a stack walk gives: an inlined frame shares its
                // caller's module; the outermost frame is a machine frame.
                for i in (0..frames.len()).rev() {
                    if i + 1 == frames.len() {
                        frames[i].inlined = false;
                    } else if frames[i].inlined {
                        frames[i].module = frames[i + 1].module.clone();
                    }
                }
                let [ao, ab, lo, lb] = values.map(f64::from);
                let totals = Totals {
                    alloc_objects: ao,
                    alloc_bytes: ab,
                    live_objects: lo,
                    live_bytes: lb,
                    ..Default::default()
                };
                (frames, totals)
            });
        let process = ("[a-z]{1,8}", proptest::collection::vec(stack, 1..5));
        proptest::collection::btree_map((1u32..1000, 0u32..3), process, 1..4).prop_map(|ps| {
            let processes = ps
                .into_iter()
                .map(|((pid, generation), (name, stacks))| {
                    let mut seen = std::collections::HashSet::new();
                    let stacks = stacks
                        .into_iter()
                        .filter(|(frames, _)| seen.insert(frames.clone()))
                        .map(|(frames, totals)| StackProfile {
                            frames: frames.into(),
                            totals,
                        })
                        .collect();
                    let key = ProcessKey { pid, generation };
                    ProcessProfile::from_stacks(key, name, ProcessState::Live, 4096, stacks)
                })
                .collect();
            Profile {
                processes,
                drops: [0; DROP_REASONS],
                elapsed: Duration::from_millis(1500),
                unwind: Default::default(),
                min_age: Duration::ZERO,
                attached_at: None,
                ran_before_attach: Vec::new(),
            }
        })
    }

    type Stacks = BTreeMap<ProcessKey, (String, HashMap<Vec<Frame>, [u64; 4]>)>;

    fn stacks(profile: &Profile) -> Stacks {
        profile
            .processes
            .iter()
            .map(|p| {
                let stacks = p
                    .stacks
                    .iter()
                    .map(|s| {
                        let t = &s.totals;
                        let v = [t.alloc_objects, t.alloc_bytes, t.live_objects, t.live_bytes];
                        (s.frames.to_vec(), v.map(|v| v as u64))
                    })
                    .collect();
                (p.key, (p.name.clone(), stacks))
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn arbitrary_profiles_round_trip(profile in arbitrary_profile()) {
            let back = decode(&render(&profile, 1)).unwrap();
            prop_assert_eq!(stacks(&back), stacks(&profile));
            // Within the size limit, a real profile is within the decoded one.
            let plain = to_proto(&profile, 1).encode_to_vec();
            let estimate = prescan(&plain, &Limits::default()).unwrap();
            prop_assert!(estimate < DECODED_PER_BYTE * plain.len() as u64);
            prop_assert_eq!(back.elapsed, profile.elapsed);
        }
    }
}
