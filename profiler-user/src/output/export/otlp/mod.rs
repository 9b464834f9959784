//! OTLP profiles export: a [`Profile`] as one `ProfilesData` (the messages
//! of the OpenTelemetry Collector's `ProfilesService`), for backends that
//! take OTLP (Pyroscope, Elastic, Datadog, Parca... through the collector).
//!
//! - One `ResourceProfiles` per process image, its resource attributes the
//!   process's (`process.pid`, `process.executable.name`, `service.name`).
//! - Four sibling `Profile`s per process, one per sample type (OTLP gives
//!   each profile one): `inuse_space/bytes` and `inuse_objects/count`, the
//!   live heap at the end of the window (a snapshot), and
//!   `alloc_space/bytes` and `alloc_objects/count`, what was allocated
//!   within the window (a delta against the previous export of the same
//!   [`Encoder`]). These are the names of the OTel memory-profiling design
//!   (ebpf-profiler design-docs 00003), the same as Go's heap profiles.
//! - Values are allocprof's unbiased estimates (nothing further to scale),
//!   rounded so that each profile's sum is the rounded total; `period` is the
//!   process's sampling rate, in `allocated_bytes` (the proto's own example).
//! - Each profile carries the window: `time_unix_nano` its start,
//!   `duration_nano` its length.
//! - The dictionary (strings, functions, locations, mappings, stacks) is
//!   shared by all processes; index 0 of each table is its zero value. A
//!   location is a symbolized frame chain (a machine frame and the functions
//!   inlined into it, innermost first), address 0 as in the pprof export;
//!   mappings carry their file's GNU build id
//!   (`process.executable.build_id.gnu`).
//! - Unsymbolized ([`Encoder::addresses_only`], `agent --no-symbolize`):
//!   a location per frame with an offset ([`Frame::offset`]), no lines, its
//!   address the file offset of the instruction (a caller's inside its call
//!   instruction, as the proto allows). Its mapping (file name, build id)
//!   is the file as if mapped whole at 0: `memory_start` and `file_offset`
//!   0, so that address − memory_start + file_offset is the file offset
//!   whatever each process's load address; `memory_limit` just past the
//!   highest address. allocprof's own markers (a truncated walk, ...) stay
//!   named, without a mapping.
//!
//! The tables are built the way `export::pprof` builds its own (strings,
//! functions by name and file, locations by frame chain, mappings by file):
//! issue 28 wants one table builder for both encoders, to be shared once the
//! pprof module's split has landed.

pub mod proto;
pub mod resource;

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use self::proto::{
    common::{AnyValue, InstrumentationScope, KeyValue, any_value},
    profiles::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile as OtlpProfile,
        ProfilesData, ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack,
        ValueType,
    },
    resource::Resource,
};
use self::resource::{AttrValue, HostResource};
use super::build_id::build_id;
use crate::{
    model::profile::{BuildIds, ProcessKey, ProcessProfile, ProcessState, Profile},
    model::stats::Totals,
    symbolize::{Frame, FrameKind, PYTHON_MODULE},
};

/// The sample types, in the order of each process's profiles.
pub const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("inuse_space", "bytes"),
    ("inuse_objects", "count"),
    ("alloc_space", "bytes"),
    ("alloc_objects", "count"),
];

/// Semantic-convention attribute names (the resource's: [`resource`]).
pub use self::resource::{
    ATTR_COMMAND_LINE, ATTR_CONTAINER_ID, ATTR_EXECUTABLE_NAME, ATTR_EXECUTABLE_PATH, ATTR_HOST_ID,
    ATTR_HOST_NAME, ATTR_PID, ATTR_POD_UID, ATTR_SERVICE_NAME,
};
pub const ATTR_BUILD_ID: &str = "process.executable.build_id.gnu";
/// A location's frame type (semantic conventions: `cpython` for Python).
pub const ATTR_FRAME_TYPE: &str = "profile.frame.type";
/// allocprof's own: the exec generation after an exec (absent before), and
/// the state of an image that is gone (absent while it runs).
pub const ATTR_GENERATION: &str = "allocprof.process.generation";
pub const ATTR_STATE: &str = "allocprof.process.state";

/// Exports of one stream of profiles: remembers what each process's stacks
/// had allocated at the previous export (the `alloc_*` deltas) and which
/// gone processes were already exported (once is enough). Bounded by the
/// last profile: what is no longer in it is forgotten.
pub struct Encoder {
    host: HostResource,
    allocated: HashMap<(ProcessKey, Arc<[Frame]>), [f64; 2]>,
    gone_exported: HashSet<ProcessKey>,
    last_end: Option<SystemTime>,
    addresses_only: bool,
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::new()
    }
}

impl Encoder {
    /// Exports with the host's resource attributes and allocprof's
    /// environment's ([`HostResource::detect`]; a malformed
    /// `OTEL_RESOURCE_ATTRIBUTES` is left out: see [`Encoder::with_host`]
    /// to be told).
    pub fn new() -> Encoder {
        Encoder::with_host(HostResource::detect().0)
    }

    pub fn with_host(host: HostResource) -> Encoder {
        Encoder {
            host,
            allocated: HashMap::new(),
            gone_exported: HashSet::new(),
            last_end: None,
            addresses_only: false,
        }
    }

    /// Exports without names: addresses, mappings and build ids, for a
    /// backend that symbolizes (of stacks left unsymbolized:
    /// `Symbolization::Addresses`).
    pub fn addresses_only(mut self) -> Encoder {
        self.addresses_only = true;
        self
    }

    /// The profile as it stands at `end`. The window starts at the previous
    /// export's end, or at the profile's start (when allocprof attached).
    pub fn encode(&mut self, profile: &Profile, end: SystemTime) -> ProfilesData {
        let start = self.last_end.unwrap_or_else(|| {
            profile
                .attached_at
                .unwrap_or_else(|| end.checked_sub(profile.elapsed).unwrap_or(end))
        });
        let window = Window {
            start: unix_nanos(start),
            duration: end.duration_since(start).unwrap_or(Duration::ZERO),
        };
        let mut b = Builder::new(self.addresses_only);
        let mut resource_profiles = Vec::new();
        let mut allocated = HashMap::new();
        let mut gone_exported = HashSet::new();
        for p in &profile.processes {
            if p.state != ProcessState::Live && self.gone_exported.contains(&p.key) {
                gone_exported.insert(p.key);
                continue;
            }
            if p.state != ProcessState::Live {
                gone_exported.insert(p.key);
            }
            let values: Vec<(&[Frame], [f64; 4])> = p
                .stacks
                .iter()
                .map(|s| {
                    let now = [s.totals.alloc_bytes, s.totals.alloc_objects];
                    let before = self
                        .allocated
                        .get(&(p.key, s.frames.clone()))
                        .copied()
                        .unwrap_or_default();
                    allocated.insert((p.key, s.frames.clone()), now);
                    let delta = |i: usize| {
                        // A baseline above the figure is a stack restarted
                        // from zero: all of it is new.
                        if now[i] >= before[i] {
                            now[i] - before[i]
                        } else {
                            now[i]
                        }
                    };
                    (&s.frames[..], live_and(&s.totals, [delta(0), delta(1)]))
                })
                .collect();
            let attributes = self.host.attributes_of(p);
            resource_profiles.push(b.resource_profiles(p, attributes, &values, window));
        }
        self.allocated = allocated;
        self.gone_exported = gone_exported;
        self.last_end = Some(end);
        ProfilesData {
            resource_profiles,
            dictionary: Some(b.finish()),
        }
    }
}

/// The profile on its own: one export, its alloc figures those since
/// allocprof attached.
pub fn encode(profile: &Profile, end: SystemTime) -> ProfilesData {
    Encoder::new().encode(profile, end)
}

/// `[inuse_space, inuse_objects, alloc_space, alloc_objects]`.
fn live_and(t: &Totals, allocated: [f64; 2]) -> [f64; 4] {
    [t.live_bytes, t.live_objects, allocated[0], allocated[1]]
}

#[derive(Clone, Copy)]
struct Window {
    start: u64,
    duration: Duration,
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Rounds a running sum, so that the values written add up to the rounded
/// total rather than drifting by half a unit per stack.
#[derive(Default)]
struct Rounding {
    exact: f64,
    written: i64,
}

impl Rounding {
    fn round(&mut self, value: f64) -> i64 {
        self.exact += value;
        let target = self.exact.round() as i64;
        let v = target - self.written;
        self.written = target;
        v
    }
}

/// The dictionary under construction: each table with its zero value at
/// index 0, and an index of what is in it.
struct Builder {
    dict: ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(i32, i32), i32>,
    /// By frame chain and mapping (one path may be several files).
    locations: HashMap<(Vec<Frame>, i32), i32>,
    /// By file path and build id: two processes may name different files
    /// by one path (containers, a library upgraded in place).
    mappings: HashMap<(String, Option<String>), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, String), i32>,
    /// Frames with an offset get no lines ([`Encoder::addresses_only`]).
    addresses_only: bool,
}

/// The table's next index (tables stay far below 2³¹ entries: they grow
/// with a profile's distinct frames, which the session bounds).
fn next_index<T>(table: &[T]) -> i32 {
    i32::try_from(table.len()).expect("dictionary within 2^31 entries")
}

impl Builder {
    fn new(addresses_only: bool) -> Builder {
        let mut b = Builder {
            dict: ProfilesDictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                // The spec's preferred zero link: ids of their full lengths.
                link_table: vec![Link {
                    trace_id: vec![0; 16],
                    span_id: vec![0; 8],
                }],
                string_table: Vec::new(),
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
            addresses_only,
        };
        b.string("");
        b
    }

    fn finish(self) -> ProfilesDictionary {
        self.dict
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = next_index(&self.dict.string_table);
        self.dict.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn string_attribute(&mut self, key: &str, value: &str) -> i32 {
        let key = self.string(key);
        if let Some(&i) = self.attributes.get(&(key, value.to_owned())) {
            return i;
        }
        let i = next_index(&self.dict.attribute_table);
        self.dict.attribute_table.push(KeyValueAndUnit {
            key_strindex: key,
            value: Some(string_value(value)),
            unit_strindex: 0,
        });
        self.attributes.insert((key, value.to_owned()), i);
        i
    }

    fn value_type(&mut self, (r#type, unit): (&str, &str)) -> ValueType {
        ValueType {
            type_strindex: self.string(r#type),
            unit_strindex: self.string(unit),
        }
    }

    /// The mapping of file `module`; its build id read from the files the
    /// process mapped (`ids`), or from the path where those are unknown.
    fn mapping(&mut self, module: &str, ids: Option<&BuildIds>) -> i32 {
        let id = match ids {
            Some(ids) => ids.get(module).map(|id| id.to_string()),
            // Python code's mapping is no file.
            None if module == PYTHON_MODULE => None,
            None => build_id(Path::new(module)),
        };
        let key = (module.to_owned(), id);
        if let Some(&i) = self.mappings.get(&key) {
            return i;
        }
        let attribute_indices = key
            .1
            .as_deref()
            .map(|id| vec![self.string_attribute(ATTR_BUILD_ID, id)])
            .unwrap_or_default();
        let i = next_index(&self.dict.mapping_table);
        let filename_strindex = self.string(module);
        self.dict.mapping_table.push(Mapping {
            filename_strindex,
            attribute_indices,
            ..Default::default()
        });
        self.mappings.insert(key, i);
        i
    }

    fn function(&mut self, name: &str, file: &str) -> i32 {
        let key = (self.string(name), self.string(file));
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let i = next_index(&self.dict.function_table);
        self.dict.function_table.push(Function {
            name_strindex: key.0,
            system_name_strindex: key.0,
            filename_strindex: key.1,
            start_line: 0,
        });
        self.functions.insert(key, i);
        i
    }

    /// A machine frame and the frames inlined into it, innermost first.
    fn location(&mut self, chain: &[Frame], ids: Option<&BuildIds>) -> i32 {
        let outer = chain.last().expect("a location has a frame");
        let mapping_index = outer.module.as_deref().map_or(0, |m| self.mapping(m, ids));
        if let Some(&i) = self.locations.get(&(chain.to_vec(), mapping_index)) {
            return i;
        }
        let lines = if self.addresses_only && outer.offset.is_some() {
            Vec::new()
        } else {
            chain
                .iter()
                .map(|f| {
                    let (file, line) = split_location(f.location.as_deref());
                    Line {
                        function_index: self.function(&f.function, file),
                        line,
                        column: 0,
                    }
                })
                .collect()
        };
        // An address lies within its mapping, which starts at 0.
        let address = outer.offset.filter(|_| mapping_index != 0).unwrap_or(0);
        if let Some(m) = usize::try_from(mapping_index)
            .ok()
            .filter(|&m| m != 0 && address != 0)
            .and_then(|m| self.dict.mapping_table.get_mut(m))
        {
            m.memory_limit = m.memory_limit.max(address.saturating_add(1));
        }
        // OpenTelemetry's frame type: a Python frame is CPython's.
        let attribute_indices = match outer.kind {
            FrameKind::Python => vec![self.string_attribute(ATTR_FRAME_TYPE, "cpython")],
            FrameKind::Native => Vec::new(),
        };
        let i = next_index(&self.dict.location_table);
        self.dict.location_table.push(Location {
            mapping_index,
            address,
            lines,
            attribute_indices,
        });
        self.locations.insert((chain.to_vec(), mapping_index), i);
        i
    }

    /// The stack of `frames` (innermost first): each machine frame with the
    /// frames inlined into it (which precede it).
    fn stack(&mut self, frames: &[Frame], ids: Option<&BuildIds>) -> i32 {
        let mut location_indices = Vec::new();
        let mut start = 0;
        for (i, f) in frames.iter().enumerate() {
            if f.inlined && i + 1 < frames.len() {
                continue;
            }
            location_indices.push(self.location(&frames[start..=i], ids));
            start = i + 1;
        }
        if let Some(&i) = self.stacks.get(&location_indices) {
            return i;
        }
        let i = next_index(&self.dict.stack_table);
        self.stacks.insert(location_indices.clone(), i);
        self.dict.stack_table.push(Stack { location_indices });
        i
    }

    fn resource_profiles(
        &mut self,
        p: &ProcessProfile,
        attributes: Vec<(String, AttrValue)>,
        values: &[(&[Frame], [f64; 4])],
        window: Window,
    ) -> ResourceProfiles {
        let mut attributes: Vec<KeyValue> = attributes
            .into_iter()
            .map(|(key, value)| KeyValue {
                key,
                value: Some(AnyValue {
                    value: Some(match value {
                        AttrValue::Int(i) => any_value::Value::IntValue(i),
                        AttrValue::Str(s) => any_value::Value::StringValue(s),
                    }),
                }),
                ..Default::default()
            })
            .collect();
        if p.key.generation != 0 {
            attributes.push(KeyValue {
                key: ATTR_GENERATION.into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(i64::from(p.key.generation))),
                }),
                ..Default::default()
            });
        }
        if p.state != ProcessState::Live {
            attributes.push(string_key_value(ATTR_STATE, p.state.describe()));
        }
        let period_type = self.value_type(("allocated_bytes", "bytes"));
        let mut profiles = Vec::with_capacity(SAMPLE_TYPES.len());
        for (i, &sample_type) in SAMPLE_TYPES.iter().enumerate() {
            let mut rounding = Rounding::default();
            let mut samples = Vec::new();
            for &(frames, v) in values {
                let value = rounding.round(v[i]);
                // Stacks enter the dictionary with their first sample: none
                // is left unreferenced.
                if value != 0 {
                    samples.push(Sample {
                        stack_index: self.stack(frames, p.build_ids.as_deref()),
                        values: vec![value],
                        ..Default::default()
                    });
                }
            }
            profiles.push(OtlpProfile {
                sample_type: Some(self.value_type(sample_type)),
                samples,
                time_unix_nano: window.start,
                duration_nano: u64::try_from(window.duration.as_nanos()).unwrap_or(u64::MAX),
                period_type: Some(period_type),
                period: i64::try_from(p.rate).unwrap_or(i64::MAX),
                ..Default::default()
            });
        }
        ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "allocprof".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }
    }
}

fn string_value(s: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.to_owned())),
    }
}

fn string_key_value(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(string_value(value)),
        ..Default::default()
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

/// The function names of a stack of `dict`, innermost first, inlined frames
/// included (for reading exports back; unknown indices read as nothing).
pub fn stack_functions(dict: &ProfilesDictionary, stack_index: i32) -> Vec<String> {
    let get = |i: i32| usize::try_from(i).ok();
    let string = |i: i32| {
        get(i)
            .and_then(|i| dict.string_table.get(i))
            .cloned()
            .unwrap_or_default()
    };
    let Some(stack) = get(stack_index).and_then(|i| dict.stack_table.get(i)) else {
        return Vec::new();
    };
    stack
        .location_indices
        .iter()
        .filter_map(|&l| get(l).and_then(|l| dict.location_table.get(l)))
        .flat_map(|l| &l.lines)
        .filter_map(|line| get(line.function_index).and_then(|f| dict.function_table.get(f)))
        .map(|f| string(f.name_strindex))
        .collect()
}

#[cfg(test)]
mod tests;
