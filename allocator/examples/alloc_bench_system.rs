//! `cargo xtask bench alloc`: the Rust workloads over `System` (the
//! reference for `alloc_bench_sampling`).

#[path = "alloc_bench/workload.rs"]
mod workload;

fn main() {
    workload::main(|| 0);
}
