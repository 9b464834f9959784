//! A Rust program whose global allocator is `SamplingAllocator<System>`,
//! run under `LD_PRELOAD=liballocprof.so`: `System` allocates with the
//! `malloc` the library interposes, so both layers would sample the same
//! allocations and their estimates would add up to twice the bytes. The
//! Rust layer stands down; the library samples each allocation once, as
//! often as the Rust layer does alone.

mod common;

use std::alloc::System;
use std::process::Command;

use allocator::{SamplingAllocator, Stats};
use common::{Backend, run_ok};

#[global_allocator]
static GLOBAL: SamplingAllocator<System> = SamplingAllocator::new(System);

const CHILD: &str = "ALLOCPROF_LAYERS_CHILD";
const BLOCKS: usize = 20_000;
const SIZE: usize = 4096;
const RATE: f64 = 65_536.0;

/// The preload library's counters, if one is loaded.
fn preload_stats() -> Option<Stats> {
    // SAFETY: dlsym with a valid name; the symbol, if found, is
    // `allocprof_stats(Stats *)` of a liballocprof*.so.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"allocprof_stats".as_ptr());
        if f.is_null() {
            return None;
        }
        let f: unsafe extern "C" fn(*mut Stats) = std::mem::transmute(f);
        let mut s = Stats::default();
        f(&mut s);
        Some(s)
    }
}

/// In the child: allocate BLOCKS blocks of SIZE bytes and print how many
/// samples each layer took meanwhile.
fn workload() {
    let (rust0, pre0) = (allocator::stats(), preload_stats());
    let blocks: Vec<Vec<u8>> = (0..BLOCKS).map(|i| vec![i as u8; SIZE]).collect();
    let (rust1, pre1) = (allocator::stats(), preload_stats());
    drop(blocks);
    let preload = match (pre0, pre1) {
        (Some(a), Some(b)) => (b.sampled - a.sampled) as i64,
        _ => -1,
    };
    println!(
        "rust_sampled={} preload_sampled={preload} defers={}",
        rust1.sampled - rust0.sampled,
        GLOBAL.defers_to_preload()
    );
}

fn field(text: &str, name: &str) -> i64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {text}"))
}

#[test]
fn one_layer_samples_when_the_rust_allocator_runs_under_the_preload() {
    if std::env::var_os(CHILD).is_some() {
        workload();
        return;
    }
    let me = std::env::current_exe().unwrap();
    let run = |preload: Option<Backend>| {
        let mut cmd = Command::new(&me);
        cmd.args([
            "--exact",
            "one_layer_samples_when_the_rust_allocator_runs_under_the_preload",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("ALLOCPROF_RATE", "64k")
        .env_remove("LD_PRELOAD");
        if let Some(b) = preload {
            cmd.env("LD_PRELOAD", common::library(b));
        }
        let out = run_ok(&mut cmd, &format!("layers child, preload {preload:?}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("preload {preload:?}: {text}");
        text
    };
    // Each 4 KiB block is sampled with probability 1 - exp(-4096/R).
    let p = 1.0 - (-(SIZE as f64) / RATE).exp();
    let expected = BLOCKS as f64 * p;
    let sd = (BLOCKS as f64 * p * (1.0 - p)).sqrt();
    // The Vec of blocks itself and the test harness add a few samples.
    let near = |n: i64| (n as f64 - expected).abs() < 5.0 * sd + 5.0;

    let alone = run(None);
    assert!(near(field(&alone, "rust_sampled")), "{alone}");
    assert_eq!(field(&alone, "preload_sampled"), -1, "{alone}");
    assert!(alone.contains("defers=false"), "{alone}");

    for backend in common::BACKENDS {
        let both = run(Some(backend));
        assert_eq!(field(&both, "rust_sampled"), 0, "{backend:?}: {both}");
        assert!(near(field(&both, "preload_sampled")), "{backend:?}: {both}");
        assert!(both.contains("defers=true"), "{backend:?}: {both}");
    }
}
