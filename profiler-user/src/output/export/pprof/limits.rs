//! What decoding accepts at most, and the checks that hold a file to it
//! before (from the wire) and after prost decodes it.

use super::{
    decode::DecodeError,
    proto::{self, Function, Label, Line, Location, Mapping, Sample, ValueType},
};

/// What [`decode`](super::decode) accepts at most. Each bound gives its own error, checked
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

/// Counts, from the wire, what prost would allocate for `data`, and fails on
/// the first count over its limit before prost allocates any of it. Stops
/// quietly at malformed bytes, where prost will stop too (with an error);
/// groups are left to prost's recursion limit. Returns the estimated bytes
/// of the decoded message.
pub(super) fn prescan(data: &[u8], limits: &Limits) -> Result<u64, DecodeError> {
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
pub(super) fn check_counts(p: &proto::Profile, limits: &Limits) -> Result<(), DecodeError> {
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
