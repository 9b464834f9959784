//! Whole user stacks in code built without frame pointers: each mapped
//! file's call-frame information compiled into an unwind table
//! (`profiler_common::unwind`), loaded into the kernel, and per process the
//! executable mappings that use them. The kernel walks with them
//! (`profiler-ebpf/src/unwind.rs`).
//! - `pool.rs`: ranges of the kernel's one row array, per file.
//! - `tables.rs`: a file's table from compile to kernel to release.

pub mod pool;
pub mod tables;
