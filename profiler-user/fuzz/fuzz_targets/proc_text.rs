//! The parsers of `/proc/PID/*` text (maps, stat, status, comm, environ) on
//! arbitrary bytes: none may panic, and each yields no more than its input
//! holds.
//!
//! Seeds: `corpus/proc_text/seed-*`, real files of this machine's /proc.
#![no_main]

use allocprof::process::{
    discover::{
        effective_caps, parse_code_size, parse_comm, parse_maps, parse_maps_read, parse_resident,
        rate_in_environ, stat_is_live,
    },
    normalize::AddressSpace,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let entries = parse_maps(&text);
    assert!(entries.len() <= text.lines().count());
    for e in &entries {
        assert!(e.path.len() <= text.len(), "{e:?}");
    }
    // As read: cut at a limit inside the input.
    let cut = parse_maps_read(data.to_vec(), data.len() as u64 / 2 + 1);
    assert!(cut.len() <= entries.len() + 1);
    let space = AddressSpace::parse(&text);
    for e in entries.iter().take(16) {
        for addr in [e.start, e.end.wrapping_sub(1), e.end] {
            if let Some(at) = space.normalize(addr) {
                assert!(at.file.path.as_os_str().len() <= text.len());
            }
        }
    }
    let _ = stat_is_live(&text);
    let _ = effective_caps(&text);
    let _ = parse_resident(&text);
    let _ = parse_code_size(&text);
    let _ = rate_in_environ(data);
    // Lossy decoding at most triples the bytes (U+FFFD for each).
    assert!(parse_comm(data).len() <= 3 * data.len());
});
