//! Types shared by the kernel programs (`profiler-ebpf`) and user space
//! (`profiler-user`). Every map key and value is `#[repr(C)]` with fixed-width
//! fields and explicit padding, so both sides agree on the layout byte for byte.
//!
//! A module per concept, its items re-exported here:
//! - the kernel's maps: `sample` (live samples and the per-stack sums),
//!   `stacks` (stack traces and their per-image ids), `counters` (per-process
//!   state), `drops` (why a sample was not accounted), `events` (ring-buffer
//!   messages), [`map_names`];
//! - the estimate: `delta` (what one sample adds to the sums, variance units),
//!   `weight_form` (how a process's weights estimate bytes), `thinning`
//!   (back-pressure);
//! - the kernel's guards: `stack_budget` (the flood budget on new stacks),
//!   `claim` (the per-CPU scratch protocol);
//! - contracts with the allocator and its probes: [`usdt`], [`rate`],
//!   [`ledger`], [`backend_stats`]; [`unwind`], the compiled unwind tables;
//!   and [`python`], Python frames in a stack.
#![no_std]

pub mod backend_stats;
mod claim;
mod counters;
mod delta;
mod drops;
mod events;
pub mod ledger;
pub mod map_names;
#[cfg(feature = "user")]
mod pod;
pub mod python;
pub mod rate;
mod sample;
mod stack_budget;
mod stacks;
mod thinning;
pub mod unwind;
pub mod usdt;
mod weight_form;

pub use claim::{ClaimCounter, release_claim, try_claim};
pub use counters::{CONTRACT_DDHEAP, CONTRACT_OTEL_MEMORY, ProcCounters};
pub use delta::{MAX_WEIGHT, OBJECT_SCALE, SampleDelta, VAR_UNIT_SHIFT, variance_in_bytes2};
pub use drops::{DROP_REASONS, DropReason};
pub use events::{
    PROC_EVENT_EXEC, PROC_EVENT_EXIT, PROC_EVENT_FORK, PROC_EVENT_OOM, ProcEvent, UnseenFree,
};
pub use sample::{AggKey, LiveKey, LiveSample, StackAgg};
pub use stack_budget::{
    DEFAULT_NEW_STACKS_BURST, DEFAULT_NEW_STACKS_PER_SECOND, MAX_NEW_STACKS_BURST, new_stack_budget,
};
pub use stacks::{
    MAX_STACK_DEPTH, NO_STACK, OVERFLOW_STACK, STACK_HASH_SEED, StackTrace, stack_hash_step,
    stack_id, stack_seed,
};
pub use thinning::{
    MAX_THIN_FACTOR, MAX_THINNED_WEIGHT, THIN_WINDOW_NS, ThinStep, thin_factor_for, thin_step,
};
pub use usdt::{MAX_USDT_ARGS, UsdtArg, UsdtArgKind, UsdtSpec};
pub use weight_form::{WeightCheck, WeightForm, weight_check};
