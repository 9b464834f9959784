//! allocprof's in-process allocator layer.
//!
//! * [`sampler`]: pure per-byte Poisson sampling core (host-testable).
//! * [`rate`]: `ALLOCPROF_RATE` parsing.
//! * [`thread_state`]: per-thread sampler in initial-exec TLS, slow path.
//! * [`sample_region`]: reserved address range holding sampled blocks.
//! * [`sampled`]: sampled-block lifecycle, probes, counters.
//! * [`usdt`]: SDT probe emitter (`otel_memory:alloc`, `otel_memory:free`).
//! * [`global`]: `SamplingAllocator`, the `#[global_allocator]` wrapper.
//! * [`capi`] + [`backend`]: the C malloc family for the LD_PRELOAD library.
#![cfg_attr(not(test), no_std)]

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("allocprof's allocator supports x86_64 Linux only (TLS and USDT asm)");

pub mod backend;
pub mod capi;
pub mod global;
pub mod rate;
pub mod sample_region;
pub mod sampled;
pub mod sampler;
mod thread_state;
pub mod usdt;

pub use global::SamplingAllocator;
pub use sampled::{Stats, stats};
pub use sampler::Sampler;
