//! `cargo xtask bench alloc`: the Rust workloads over
//! `SamplingAllocator<System>` (compared with `alloc_bench_system`).

use allocator::SamplingAllocator;
use std::alloc::System;

#[global_allocator]
static GLOBAL: SamplingAllocator<System> = SamplingAllocator::new(System);

#[path = "alloc_bench/workload.rs"]
mod workload;

fn main() {
    workload::main(|| allocator::stats().sampled);
}
