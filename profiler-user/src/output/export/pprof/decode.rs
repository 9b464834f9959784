//! The decoder: a pprof heap profile read back, within [`Limits`].

use std::{
    collections::{BTreeMap, HashMap},
    io::Read,
    path::Path,
    sync::Arc,
    time::Duration,
};

use flate2::read::GzDecoder;
use profiler_common::DROP_REASONS;
use prost::Message;
use thiserror::Error;

use super::{
    LABEL_GENERATION, LABEL_PID, LABEL_PROCESS, SAMPLE_TYPES,
    limits::{DECODED_PER_BYTE, Limits, check_counts, prescan},
    proto,
};
use crate::{
    ids::Pid,
    model::profile::{
        ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile, sort_processes,
    },
    model::stats::{Totals, human_bytes},
    symbolize::{Frame, FrameKind, Name, PYTHON_MODULE},
};

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
                offset: None,
                kind: frame_kind(module.as_deref()),
            });
        }
        if frames.is_empty() {
            // Unsymbolized (e.g. a raw Go profile): name it by address.
            frames.push(Frame {
                function: format!("[unknown {:#x}]", l.address).into(),
                location: None,
                module,
                inlined: false,
                offset: None,
                kind: FrameKind::Native,
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
            pid: Pid(0),
            generation: 0,
        };
        let mut name = None;
        for l in &s.label {
            match string(l.key)? {
                LABEL_PROCESS => name = Some(string(l.str)?.to_string()),
                LABEL_PID => key.pid = Pid(u32::try_from(l.num).unwrap_or(0)),
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

/// Python code is filed under a mapping of its own ([`PYTHON_MODULE`]).
fn frame_kind(module: Option<&str>) -> FrameKind {
    match module {
        Some(PYTHON_MODULE) => FrameKind::Python,
        _ => FrameKind::Native,
    }
}
