//! The pprof export's unit tests, by what they cover: the file's shape
//! (`encode.rs`), the way back (`round_trip.rs`), the limits on what is read
//! (`limits.rs`) and malformed files (`malformed.rs`).

mod encode;
mod limits;
mod malformed;
mod round_trip;

use std::path::Path;

use prost::Message;

use super::{decode, encode::to_proto, render};
use crate::{model::profile::Profile, output::export::tests::hand_made};

fn decoded(profile: &Profile) -> Profile {
    decode(&render(profile, 1)).unwrap()
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
