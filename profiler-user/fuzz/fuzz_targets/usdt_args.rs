//! USDT argument-string compilation on arbitrary text: must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use allocprof::process::usdt::parse_args;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_args(text);
    }
});
