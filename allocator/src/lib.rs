//! allocprof's in-process allocator layer.
//!
//! * [`sampler`]: pure per-byte Poisson sampling core (host-testable).
//! * [`rate`]: `ALLOCPROF_RATE` parsing.
//! * [`budget`]: the per-process sample budget (`ALLOCPROF_MAX_EVENT_RATE`).
//! * [`thread_state`]: per-thread sampler in initial-exec TLS, slow path.
//! * [`sample_region`]: reserved address range holding sampled blocks.
//! * [`sampled`]: sampled-block lifecycle, probes, counters.
//! * [`usdt`]: SDT probe emitter (`otel_memory:alloc`, `otel_memory:free`).
//! * [`global`]: `SamplingAllocator`, the `#[global_allocator]` wrapper.
//! * [`capi`] + [`backend`]: the C malloc family for the LD_PRELOAD library.
//! * [`backend_stats`]: the backend's own figures, in a block allocprof reads.
//! * [`ledger`]: the live-sample ledger (every live sample's stack), read likewise.
//! * [`errno`]: call-free errno access (free preserves errno).
//! * `env`: the `ALLOCPROF_*` variables, also before libc set up `environ`.
//! * `clock`: the monotonic clock of the published figures (and the
//!   budget's coarse one).
#![cfg_attr(not(test), no_std)]

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("allocprof's allocator supports x86_64 Linux only (TLS and USDT asm)");

/// Relaxed load of a word-sized atomic static of this crate, addressed
/// `rip`-relative. rustc emits non-relaxable `R_X86_64_GOTPCREL` for
/// statics of another crate (this rlib, seen from the cdylib that
/// instantiates the generic C entry points), so a plain `.load()` on a hot
/// path costs a GOT load plus the load. None of these statics is exported
/// from a library we build (the cdylibs export only the C API), so the
/// link resolves the reference locally. An aligned 8-byte `mov` is an
/// atomic load on x86_64.
macro_rules! load_relaxed_direct {
    ($static:path => $int:ty) => {{
        let v: $int;
        // SAFETY: reads the 8 bytes of an aligned atomic static of this
        // crate; no other memory, stack or flags are touched.
        unsafe {
            ::core::arch::asm!(
                "mov {v}, qword ptr [rip + {s}]",
                v = out(reg) v,
                s = sym $static,
                options(readonly, nostack, preserves_flags),
            );
        }
        v
    }};
}

pub mod backend;
pub mod backend_stats;
pub mod budget;
pub mod capi;
mod clock;
mod env;
pub mod errno;
pub mod global;
pub mod ledger;
pub mod rate;
pub mod sample_region;
pub mod sampled;
pub mod sampler;
mod thread_state;
pub mod usdt;

pub use global::SamplingAllocator;
pub use sampled::{Stats, stats};
pub use sampler::Sampler;
