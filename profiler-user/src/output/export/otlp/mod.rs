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
//! The tables (strings, functions, mappings, locations, stacks) are
//! `export::tables`', the same as pprof's; this module writes them as the
//! dictionary, with the attribute table its own.

pub mod proto;
pub mod resource;

use std::{
    collections::{HashMap, HashSet},
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
use super::tables::Tables;
use crate::{
    model::profile::{BuildIds, ProcessKey, ProcessProfile, ProcessState, Profile},
    model::stats::Totals,
    symbolize::{Frame, FrameKind},
};
use foldhash::fast::RandomState;

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
    /// foldhash: keys hash every frame's names (SipHash was a tenth of
    /// an export).
    allocated: HashMap<(ProcessKey, Arc<[Frame]>), [f64; 2], RandomState>,
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
            allocated: HashMap::default(),
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
        let mut allocated = HashMap::default();
        let mut gone_exported = HashSet::new();
        for p in &profile.processes {
            if p.state != ProcessState::Live && self.gone_exported.contains(&p.key) {
                gone_exported.insert(p.key);
                continue;
            }
            if p.state != ProcessState::Live {
                gone_exported.insert(p.key);
            }
            let values: Vec<(&Arc<[Frame]>, [f64; 4])> = p
                .stacks
                .iter()
                .map(|s| {
                    let now = [s.totals.alloc_bytes, s.totals.alloc_objects];
                    let key = (p.key, s.frames.clone());
                    let before = self.allocated.get(&key).copied().unwrap_or_default();
                    allocated.insert(key, now);
                    let delta = |i: usize| {
                        // A baseline above the figure is a stack restarted
                        // from zero: all of it is new.
                        if now[i] >= before[i] {
                            now[i] - before[i]
                        } else {
                            now[i]
                        }
                    };
                    (&s.frames, live_and(&s.totals, [delta(0), delta(1)]))
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

/// The dictionary under construction: the shared [`Tables`] and the
/// attribute table (OTLP's own), each written with its zero value at
/// index 0.
struct Builder {
    tables: Tables,
    attribute_table: Vec<KeyValueAndUnit>,
    attributes: HashMap<(i32, String), i32>,
}

/// A position in a table as an OTLP index (tables stay far below 2³¹
/// entries: they grow with a profile's distinct frames, which the session
/// bounds).
fn index(i: usize) -> i32 {
    i32::try_from(i).expect("dictionary within 2^31 entries")
}

/// A [`Tables`] entry's index: past the zero value.
fn entry(i: usize) -> i32 {
    index(i + 1)
}

impl Builder {
    fn new(addresses_only: bool) -> Builder {
        Builder {
            tables: Tables::new(addresses_only),
            attribute_table: vec![KeyValueAndUnit::default()],
            attributes: HashMap::new(),
        }
    }

    fn finish(mut self) -> ProfilesDictionary {
        let build_ids: Vec<Vec<i32>> = (0..self.tables.mappings.len())
            .map(|i| match self.tables.mappings[i].build_id.clone() {
                Some(id) => vec![self.string_attribute(ATTR_BUILD_ID, &id)],
                None => Vec::new(),
            })
            .collect();
        // OpenTelemetry's frame type: a Python frame is CPython's.
        let cpython = self
            .tables
            .locations
            .iter()
            .any(|l| l.kind == FrameKind::Python)
            .then(|| self.string_attribute(ATTR_FRAME_TYPE, "cpython"));
        let t = self.tables;
        let mapping_table = std::iter::once(Mapping::default())
            .chain(
                t.mappings
                    .iter()
                    .zip(build_ids)
                    .map(|(m, attribute_indices)| Mapping {
                        filename_strindex: index(m.path),
                        attribute_indices,
                        memory_limit: m.memory_limit,
                        ..Default::default()
                    }),
            )
            .collect();
        let location_table = std::iter::once(Location::default())
            .chain(t.locations.iter().map(|l| {
                Location {
                    mapping_index: l.mapping.map_or(0, entry),
                    address: l.address,
                    lines: l
                        .lines
                        .iter()
                        .map(|line| Line {
                            function_index: entry(line.function),
                            line: line.line,
                            column: 0,
                        })
                        .collect(),
                    attribute_indices: match (l.kind, cpython) {
                        (FrameKind::Python, Some(i)) => vec![i],
                        _ => Vec::new(),
                    },
                }
            }))
            .collect();
        let function_table = std::iter::once(Function::default())
            .chain(t.functions.iter().map(|f| Function {
                name_strindex: index(f.name),
                system_name_strindex: index(f.name),
                filename_strindex: index(f.file),
                start_line: 0,
            }))
            .collect();
        let stack_table = std::iter::once(Stack::default())
            .chain(t.stacks.iter().map(|s| Stack {
                location_indices: s.iter().map(|&l| entry(l)).collect(),
            }))
            .collect();
        ProfilesDictionary {
            mapping_table,
            location_table,
            function_table,
            // The spec's preferred zero link: ids of their full lengths.
            link_table: vec![Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: t.strings,
            attribute_table: self.attribute_table,
            stack_table,
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        index(self.tables.string(s))
    }

    fn string_attribute(&mut self, key: &str, value: &str) -> i32 {
        let key = self.string(key);
        if let Some(&i) = self.attributes.get(&(key, value.to_owned())) {
            return i;
        }
        let i = index(self.attribute_table.len());
        self.attribute_table.push(KeyValueAndUnit {
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

    /// The stack of `frames` (innermost first).
    fn stack(&mut self, frames: &Arc<[Frame]>, ids: Option<&Arc<BuildIds>>) -> i32 {
        entry(self.tables.shared_stack(frames, ids))
    }

    fn resource_profiles(
        &mut self,
        p: &ProcessProfile,
        attributes: Vec<(String, AttrValue)>,
        values: &[(&Arc<[Frame]>, [f64; 4])],
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
                        stack_index: self.stack(frames, p.build_ids.as_ref()),
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
