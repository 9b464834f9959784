//! `.note.stapsdt` parsing on arbitrary bytes, then argument compilation of
//! whatever probes come out: neither may panic, and any file offset found
//! must lie inside the input.
//!
//! Seed the corpus with real ELF files for useful coverage, e.g. the test
//! fixtures in `target/tmp/usdt-fixtures/` or any binary with probes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use allocprof::process::usdt::probes_in_elf;

fuzz_target!(|data: &[u8]| {
    if let Ok(probes) = probes_in_elf(data) {
        for probe in probes {
            if let Ok(offset) = probe.file_offset {
                assert!(offset < data.len() as u64, "{probe:?}");
            }
            if let Some(offset) = probe.semaphore_offset {
                assert!(offset < data.len() as u64, "{probe:?}");
            }
            let _ = probe.spec();
        }
    }
});
