//! The demo workload: a small "service" with a few recognisable heap
//! behaviours, built with the allocprof global allocator so allocprof can
//! profile it. Runs until killed, or for the seconds given as argument.

use std::{
    alloc::System,
    collections::HashMap,
    hint::black_box,
    time::{Duration, Instant},
};

use allocator::SamplingAllocator;

#[global_allocator]
static GLOBAL: SamplingAllocator<System> = SamplingAllocator::new(System);

/// Grows without bound: the leak to find.
#[inline(never)]
fn remember_request(log: &mut Vec<Vec<u8>>, n: usize) {
    log.push(vec![n as u8; 4096]);
}

/// A working set that is rebuilt, so it stays about the same size.
#[inline(never)]
fn rebuild_index(n: usize) -> HashMap<u64, String> {
    (0..n as u64)
        .map(|i| (i, format!("entry-{i:08}")))
        .collect()
}

/// A few large buffers held for the whole run.
#[inline(never)]
fn allocate_buffers() -> Vec<Vec<u8>> {
    (0..4).map(|i| vec![i as u8; 8 << 20]).collect()
}

/// Short-lived small allocations: lots of traffic, little live memory.
#[inline(never)]
fn handle_request(i: usize) -> usize {
    let parts: Vec<String> = (0..16).map(|j| format!("{i}:{j}")).collect();
    black_box(parts.join(",")).len()
}

fn main() {
    let seconds: Option<u64> = std::env::args().nth(1).and_then(|s| s.parse().ok());
    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    println!("allocprof-demo: pid {}", std::process::id());
    // Give a profiler started alongside a moment to attach.
    std::thread::sleep(Duration::from_secs(1));
    let buffers = allocate_buffers();
    let mut log = Vec::new();
    let mut index = rebuild_index(50_000);
    let mut served = 0usize;
    while deadline.is_none_or(|d| Instant::now() < d) {
        for _ in 0..200 {
            served += handle_request(served);
        }
        remember_request(&mut log, served);
        if log.len() % 100 == 0 {
            index = rebuild_index(50_000);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    black_box((&buffers, &log, &index));
}
