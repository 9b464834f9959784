//! Library half of allocprof: discovery, the kernel interface, and the pure
//! cores (statistics, profile model, symbolization, output formats) that the
//! binary drives. Only `kernel` talks to aya.

pub mod age;
pub mod backend_stats;
pub mod btf;
pub mod discover;
pub mod export;
pub mod ids;
pub mod inert;
pub mod kernel;
pub mod ledger;
pub(crate) mod map_batch;
pub mod normalize;
pub mod oom;
pub mod output;
pub(crate) mod pidns;
pub mod profile;
pub mod report;
pub mod session;
pub mod stats;
pub mod symbolize;
pub mod target_memory;
pub mod unwind;
pub mod usdt;
