//! The kernel's per-process state: event counts, drops, the new-stack and
//! back-pressure state, the weight-form tallies, the probe contracts the
//! process spoke and its name at first sight.

use crate::DROP_REASONS;

/// Per-process state kept by the kernel side.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcCounters {
    /// Bumped on every exec: aggregates of the old image stay apart.
    pub generation: u32,
    pub _pad: u32,
    pub live_samples: u64,
    pub alloc_events: u64,
    pub free_events: u64,
    /// Unbiased bytes of samples missing from the live sums (dropped before
    /// they were counted live, or untracked by the emitter): the live
    /// estimate is a lower bound, short by at most this.
    pub lost_live_bytes: u64,
    /// Budget of new stack-table entries: the theoretical arrival time (ns,
    /// `bpf_ktime_get_ns`) of [`new_stack_budget`]'s rate limiter.
    ///
    /// [`new_stack_budget`]: crate::new_stack_budget
    pub stack_budget_ns: u64,
    /// Which probe contracts the process fired alloc probes of: a bit per
    /// provider ([`CONTRACT_OTEL_MEMORY`], [`CONTRACT_DDHEAP`]).
    pub contracts: u64,
    /// The weight form, tracked per process (see [`weight_check`]): the
    /// smallest valid weight seen (0: none yet), and how many weights were
    /// not a multiple of the smallest (at the time), below their size, or
    /// invalid (0, or at least [`MAX_WEIGHT`]).
    ///
    /// [`MAX_WEIGHT`]: crate::MAX_WEIGHT
    /// [`weight_check`]: crate::weight_check
    pub min_weight: u64,
    pub weights_not_multiple: u64,
    pub weights_below_size: u64,
    pub weights_invalid: u64,
    /// `otel_memory:mmap` minus `munmap` bytes (wrapping: user space reads
    /// it as signed): memory the emitter mapped on its own account, beside
    /// the heap; and how many `mmap` probes fired.
    pub mapped_bytes: u64,
    pub mmap_events: u64,
    /// Back-pressure (see [`thin_step`]): the current window's start and
    /// alloc events, the factor in force, and the alloc events not kept.
    ///
    /// [`thin_step`]: crate::thin_step
    pub thin_window_ns: u64,
    pub thin_window_events: u64,
    pub thin_factor: u64,
    pub thinned_events: u64,
    /// The name the kernel saw at the image's first alloc event (`comm`,
    /// NUL-padded; cleared at exec): the name of a process that exits
    /// before user space reads `/proc`.
    pub comm: [u8; 16],
    pub drops: [u64; DROP_REASONS],
}

impl ProcCounters {
    /// [`ProcCounters::comm`] up to its first NUL, if set.
    pub fn comm_bytes(&self) -> Option<&[u8]> {
        let len = self
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.comm.len());
        (len > 0).then(|| &self.comm[..len])
    }
}

/// Provider `otel_memory` (the OpenTelemetry contract; allocprof's allocator).
pub const CONTRACT_OTEL_MEMORY: u32 = 1;
/// Provider `ddheap` (Datadog's heap sampler, before its rename).
pub const CONTRACT_DDHEAP: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layout_has_no_implicit_padding() {
        assert_eq!(size_of::<ProcCounters>(), 152 + 8 * DROP_REASONS);
    }
}
