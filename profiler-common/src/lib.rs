//! Types shared by the kernel programs (`profiler-ebpf`) and user space
//! (`profiler-user`). Every map key and value is `#[repr(C)]` with fixed-width
//! fields and explicit padding, so both sides agree on the layout byte for byte.
#![no_std]

pub mod rate;
pub mod usdt;

pub use usdt::{MAX_USDT_ARGS, UsdtArg, UsdtArgKind, UsdtSpec};

/// Deepest user stack taken per sample (the kernel's own limit is 127).
pub const MAX_STACK_DEPTH: usize = 127;

/// Estimated object counts are kept in fixed point: `objects * OBJECT_SCALE`.
/// The kernel cannot use floats; 1/65536 of an object is plenty of resolution.
pub const OBJECT_SCALE: u64 = 1 << 16;

/// Key of a live sampled allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub pid: u32,
    pub _pad: u32,
    pub ptr: u64,
}

/// A live sampled allocation: what to subtract from which aggregate at free.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveSample {
    pub stack_id: u64,
    pub size: u64,
    /// Unbiased byte estimate `size / p`, as passed by the allocator.
    pub weight: u64,
    /// `ProcState::generation` when the sample was taken (bumped on exec).
    pub generation: u32,
    pub _pad: u32,
}

/// Key of the per-process, per-stack aggregates.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AggKey {
    pub pid: u32,
    pub generation: u32,
    pub stack_id: u64,
}

/// Unbiased sums per (process, stack). Objects are scaled by [`OBJECT_SCALE`];
/// `*_var` is the Horvitz-Thompson variance estimate `Σ weight·(weight - size)`,
/// i.e. `Σ w²(1 - p)` with `p = size / weight`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackAgg {
    pub live_bytes: u64,
    pub live_objects: u64,
    pub live_var: u64,
    pub live_samples: u64,
    pub alloc_bytes: u64,
    pub alloc_objects: u64,
    pub alloc_var: u64,
    pub alloc_samples: u64,
}

/// What one sample adds to (and its free subtracts from) the sums: unbiased
/// bytes (the weight), objects (`weight / size`, fixed point) and the variance
/// term `w·(w - size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleDelta {
    pub bytes: u64,
    pub objects: u64,
    pub var: u64,
}

/// Weights are clamped so the products fit in 64 bits without an overflow
/// check (the BPF backend has no 128-bit multiply): exact for weights up to
/// 1 TiB, and for `w - size` (which never exceeds about R) up to 16 MiB.
const MAX_WEIGHT: u64 = 1 << 40;
const MAX_EXCESS: u64 = 1 << 24;

impl SampleDelta {
    #[inline(always)]
    pub fn of(size: u64, weight: u64) -> SampleDelta {
        let weight = if weight < MAX_WEIGHT {
            weight
        } else {
            MAX_WEIGHT
        };
        let excess = weight.saturating_sub(size);
        let excess = if excess < MAX_EXCESS {
            excess
        } else {
            MAX_EXCESS
        };
        let size = if size == 0 { 1 } else { size };
        SampleDelta {
            bytes: weight,
            objects: weight.wrapping_mul(OBJECT_SCALE) / size,
            var: weight.wrapping_mul(excess),
        }
    }
}

/// A user stack, content-addressed by [`stack_hash`] of its frames.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackTrace {
    pub len: u64,
    pub frames: [u64; MAX_STACK_DEPTH],
}

/// Why a sampled event was not accounted. Index into the drop counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The global live-sample table is full.
    LiveMapFull = 0,
    /// The process reached its cap of live samples.
    ProcessCap = 1,
    /// `bpf_get_stack` failed.
    StackFailed = 2,
    /// The stack table is full.
    StackMapFull = 3,
    /// The aggregate table is full.
    AggMapFull = 4,
    /// A probe argument could not be read.
    ArgReadFailed = 5,
    /// A free of a pointer that has no live sample (e.g. sampled before attach).
    UnmatchedFree = 6,
    /// An alloc at an address that still had a live sample (its free was missed).
    ReplacedLive = 7,
    /// The per-process state table is full.
    ProcMapFull = 8,
}

pub const DROP_REASONS: usize = 9;

impl DropReason {
    pub const ALL: [DropReason; DROP_REASONS] = [
        DropReason::LiveMapFull,
        DropReason::ProcessCap,
        DropReason::StackFailed,
        DropReason::StackMapFull,
        DropReason::AggMapFull,
        DropReason::ArgReadFailed,
        DropReason::UnmatchedFree,
        DropReason::ReplacedLive,
        DropReason::ProcMapFull,
    ];

    pub const fn describe(self) -> &'static str {
        match self {
            DropReason::LiveMapFull => "global live-sample cap reached",
            DropReason::ProcessCap => "per-process live-sample cap reached",
            DropReason::StackFailed => "user stack could not be taken",
            DropReason::StackMapFull => "stack table full",
            DropReason::AggMapFull => "aggregate table full",
            DropReason::ArgReadFailed => "probe argument unreadable",
            DropReason::UnmatchedFree => "free of a sample taken before attach",
            DropReason::ReplacedLive => "alloc over a live sample (missed free)",
            DropReason::ProcMapFull => "process table full",
        }
    }
}

/// Per-process state kept by the kernel side.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcState {
    /// Bumped on every exec: aggregates of the old image stay apart.
    pub generation: u32,
    pub _pad: u32,
    pub live_samples: u64,
    pub alloc_events: u64,
    pub free_events: u64,
    pub drops: [u64; DROP_REASONS],
}

/// Process lifecycle event sent to user space through a ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    pub pid: u32,
    pub kind: u32,
}

pub const PROC_EVENT_EXIT: u32 = 1;
pub const PROC_EVENT_EXEC: u32 = 2;

/// FNV-1a over the frames: the content address of a stack. Shared so that
/// user space can recompute and verify it.
#[inline(always)]
pub fn stack_hash_step(hash: u64, frame: u64) -> u64 {
    (hash ^ frame).wrapping_mul(0x0000_0100_0000_01b3)
}

pub const STACK_HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are #[repr(C)] with only integer fields and explicit
    // padding, so every bit pattern is valid and there are no padding bytes.
    unsafe impl aya::Pod for LiveKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LiveSample {}
    // SAFETY: as above.
    unsafe impl aya::Pod for AggKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for StackAgg {}
    // SAFETY: as above.
    unsafe impl aya::Pod for StackTrace {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProcState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProcEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for UsdtSpec {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<LiveKey>(), 16);
        assert_eq!(size_of::<LiveSample>(), 32);
        assert_eq!(size_of::<AggKey>(), 16);
        assert_eq!(size_of::<StackAgg>(), 64);
        assert_eq!(size_of::<StackTrace>(), 8 * (1 + MAX_STACK_DEPTH));
        assert_eq!(size_of::<ProcState>(), 32 + 8 * DROP_REASONS);
        assert_eq!(size_of::<ProcEvent>(), 8);
        assert_eq!(size_of::<UsdtArg>(), 16);
        assert_eq!(size_of::<UsdtSpec>(), 16 * MAX_USDT_ARGS + 8);
    }

    #[test]
    fn sample_delta_is_the_unbiased_contribution() {
        // Sampled with p = 1/4: counts as 4 objects, 4x the bytes.
        let d = SampleDelta::of(100, 400);
        assert_eq!(d.bytes, 400);
        assert_eq!(d.objects, 4 * OBJECT_SCALE);
        assert_eq!(d.var, 400 * 300);
        // A huge allocation is always sampled: no variance.
        assert_eq!(SampleDelta::of(1 << 30, 1 << 30).var, 0);
    }

    #[test]
    fn drop_reasons_index_their_own_slot() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
