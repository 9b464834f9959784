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

mod decode;
mod encode;
mod limits;
pub mod proto;
#[cfg(test)]
mod tests;

pub use self::{
    decode::{DecodeError, decode, decode_with},
    encode::render,
    limits::{Limits, MAX_PROFILE_BYTES},
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
