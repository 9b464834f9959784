//! pprof decoding (`allocprof diff`'s reader) on arbitrary bytes, both as a
//! plain `profile.proto` and gzip'd: neither may panic, and whatever decodes
//! stays within the limits.
//!
//! Seeds: `corpus/pprof/seed-*`, profiles allocprof rendered (the unit test
//! `export::pprof::tests::fuzz_seeds` writes them where asked).
#![no_main]

use std::io::Write;

use allocprof::output::export::pprof::{Limits, decode, decode_with};
use flate2::{Compression, write::GzEncoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check(decode(data));
    // The gzip path, on the same bytes compressed (fast: the fuzzer's time
    // is for the decoder).
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(data).expect("writing to memory");
    let gz = gz.finish().expect("writing to memory");
    let small = Limits {
        samples: 64,
        locations: 64,
        functions: 64,
        strings: 256,
        frames: 4096,
        ..Limits::default()
    };
    check(decode_with(&gz, &small));
});

fn check(decoded: Result<allocprof::model::profile::Profile, allocprof::output::export::pprof::DecodeError>) {
    if let Ok(profile) = decoded {
        let frames: usize = profile
            .processes
            .iter()
            .flat_map(|p| &p.stacks)
            .map(|s| s.frames.len())
            .sum();
        assert!(frames <= Limits::default().frames);
    }
}
