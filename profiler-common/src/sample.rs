//! What the kernel keeps per sampled allocation while it is live, and the
//! per-process, per-stack sums its alloc adds to and its free subtracts from.

use crate::SampleDelta;

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
    /// `ProcCounters::generation` when the sample was taken (bumped on exec).
    pub generation: u32,
    /// Back-pressure: its process kept 1 in `thin_factor` alloc events when
    /// it was taken (0 or 1: every one), so it stands for `thin_factor`
    /// times its weight (see [`SampleDelta::thinned`]).
    pub thin_factor: u32,
    /// When it was allocated (`bpf_ktime_get_ns`: CLOCK_MONOTONIC), for
    /// leaks by age.
    pub allocated_ns: u64,
}

impl LiveSample {
    /// What it added to its aggregate (and its free subtracts).
    #[inline(always)]
    pub fn delta(&self) -> SampleDelta {
        SampleDelta::thinned(self.size, self.weight, u64::from(self.thin_factor))
    }
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
/// i.e. `Σ w²(1 - p)` with `p = size / weight`, in units of
/// 2^[`VAR_UNIT_SHIFT`] bytes² (see [`SampleDelta::of`]).
///
/// [`OBJECT_SCALE`]: crate::OBJECT_SCALE
/// [`VAR_UNIT_SHIFT`]: crate::VAR_UNIT_SHIFT
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
    /// The part of the variance that back-pressure adds, `Σ w'·(w' − w)`
    /// for samples kept 1 in m with weight `w' = m·w` (units as `*_var`,
    /// which include it): `nsamples × R` weights, whose variance user space
    /// computes as R·bytes, need it added.
    pub live_thin_var: u64,
    pub alloc_thin_var: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<LiveKey>(), 16);
        assert_eq!(size_of::<LiveSample>(), 40);
        assert_eq!(size_of::<AggKey>(), 16);
        assert_eq!(size_of::<StackAgg>(), 80);
    }
}
