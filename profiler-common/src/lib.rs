//! Types shared by the kernel programs (`profiler-ebpf`) and user space
//! (`profiler-user`). Every map key and value is `#[repr(C)]` with fixed-width
//! fields and explicit padding, so both sides agree on the layout byte for byte.
#![no_std]

pub mod backend_stats;
pub mod ledger;
pub mod rate;
pub mod unwind;
pub mod usdt;

/// The kernel object's map names, as user space looks them up (the kernel
/// side names each map by its `static`; loading fails on any mismatch).
pub mod map_names {
    pub const USDT_SPECS: &str = "USDT_SPECS";
    pub const LIVE: &str = "LIVE";
    pub const AGGS: &str = "AGGS";
    pub const STACKS: &str = "STACKS";
    pub const PROCS: &str = "PROCS";
    pub const DROPS: &str = "DROPS";
    pub const PROC_EVENTS: &str = "PROC_EVENTS";
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    pub const UNWIND_PROCS: &str = "UNWIND_PROCS";
    pub const SEEDED_PIDS: &str = "SEEDED_PIDS";
    pub const UNSEEN_FREES: &str = "UNSEEN_FREES";
}

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

/// What one sample adds to (and its free subtracts from) the sums: unbiased
/// bytes (the weight), objects (`weight / size`, fixed point) and the variance
/// term `w·(w - size)` in units of 2^[`VAR_UNIT_SHIFT`] bytes².
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleDelta {
    pub bytes: u64,
    pub objects: u64,
    pub var: u64,
    /// The part of `var` due to back-pressure (0 for a sample every event
    /// of which was kept): see [`SampleDelta::thinned`].
    pub thin_var: u64,
}

/// Variance sums count units of `2^VAR_UNIT_SHIFT` bytes², so that a u64 sum
/// holds 2^80 bytes²: about 2^42 samples of one stack at R = 512 KiB (no
/// wrap in decades at 1 GB/s), where bytes² would wrap after 2^26.
pub const VAR_UNIT_SHIFT: u32 = 16;
/// Each factor of `w·(w - size)` is rounded up to a multiple of 2^HALF, so
/// the variance is never understated (overstated by < 2^HALF / factor:
/// 0.05% at R = 512 KiB, 6% at the smallest useful R of 4 KiB).
const HALF_SHIFT: u32 = VAR_UNIT_SHIFT / 2;
/// Weights are clamped so the products fit in 64 bits without an overflow
/// check (the BPF backend has no 128-bit multiply): bytes and objects are
/// exact for weights up to 1 TiB; each variance factor is exact up to
/// 512 GiB, so any practical R (the excess `w - size` never exceeds about R).
pub const MAX_WEIGHT: u64 = 1 << 40;
const MAX_VAR_FACTOR: u64 = 1 << 39;

/// `x` clamped and rounded up to units of 2^HALF_SHIFT: at most 2^31.
#[inline(always)]
const fn var_factor(x: u64) -> u64 {
    let x = if x < MAX_VAR_FACTOR {
        x
    } else {
        MAX_VAR_FACTOR
    };
    (x + (1 << HALF_SHIFT) - 1) >> HALF_SHIFT
}

/// A variance sum in bytes².
pub fn variance_in_bytes2(units: u64) -> f64 {
    units as f64 * (1u64 << VAR_UNIT_SHIFT) as f64
}

impl SampleDelta {
    #[inline(always)]
    pub fn of(size: u64, weight: u64) -> SampleDelta {
        let weight = if weight < MAX_WEIGHT {
            weight
        } else {
            MAX_WEIGHT
        };
        let excess = weight.saturating_sub(size);
        let size = if size == 0 { 1 } else { size };
        SampleDelta {
            bytes: weight,
            objects: weight.wrapping_mul(OBJECT_SCALE) / size,
            var: var_factor(weight) * var_factor(excess),
            thin_var: 0,
        }
    }

    /// A sample kept with probability `1/factor` (back-pressure): it counts
    /// `w' = factor·weight` bytes, unbiased again. Its variance term is the
    /// Horvitz-Thompson one of the combined inclusion probability,
    /// `w'·(w' − size)`, which is the first stage's term scaled by `factor`
    /// plus the thinning's own `w'·(w' − w)` (kept apart in `thin_var`).
    /// Exact when `factor` came from [`thin_factor_for`] (the kernel's);
    /// a larger one would be clamped here, silently short.
    #[inline(always)]
    pub fn thinned(size: u64, weight: u64, factor: u64) -> SampleDelta {
        if factor <= 1 {
            return SampleDelta::of(size, weight);
        }
        let weight = if weight < MAX_WEIGHT {
            weight
        } else {
            MAX_WEIGHT
        };
        let factor = if factor < MAX_THIN_FACTOR {
            factor
        } else {
            MAX_THIN_FACTOR
        };
        // < 2^60: no overflow; clamped like any weight.
        let scaled = weight * factor;
        let mut d = SampleDelta::of(size, scaled);
        d.thin_var = var_factor(d.bytes) * var_factor(d.bytes - weight);
        d
    }
}

/// Back-pressure (`--max-event-rate`): the window over which a process's
/// alloc events are counted to decide how many to keep.
pub const THIN_WINDOW_NS: u64 = 100_000_000;
/// The most a sample can stand for: 1 kept in 2^20.
pub const MAX_THIN_FACTOR: u64 = 1 << 20;

/// A process's back-pressure state after one more alloc event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinStep {
    pub window_ns: u64,
    pub window_events: u64,
    /// Keep this event with probability 1/factor (a power of two).
    pub factor: u64,
}

/// Decides how many alloc events of a process to keep so that the kept
/// ones stay near `per_second` (0: keep all). Each window of
/// [`THIN_WINDOW_NS`] starts from the factor the last window's rate asks
/// for, and within a window the factor rises as soon as the events so far
/// would exceed the window's allowance at it: a steady rate is held at the
/// budget, a burst costs at most a logarithmic overshoot. The factor is
/// decided before the event's own draw, so whichever it is, keeping 1 in
/// `factor` and scaling by `factor` is unbiased.
#[inline(always)]
pub fn thin_step(
    window_ns: u64,
    window_events: u64,
    factor: u64,
    now_ns: u64,
    per_second: u64,
) -> ThinStep {
    if per_second == 0 {
        return ThinStep {
            window_ns,
            window_events,
            factor: 1,
        };
    }
    // Clamped so the products below fit in 64 bits (the BPF target has no
    // 128-bit multiply, which saturating_mul would need).
    const MAX_RATE: u64 = 1_000_000_000;
    let per_second = if per_second < MAX_RATE {
        per_second
    } else {
        MAX_RATE
    };
    let allowance = {
        let a = per_second * THIN_WINDOW_NS / 1_000_000_000;
        if a == 0 { 1 } else { a }
    };
    let elapsed = now_ns.wrapping_sub(window_ns);
    let (window_ns, events, base) = if window_ns == 0 || elapsed >= THIN_WINDOW_NS {
        // The last window's rate, per window (0 after a long pause).
        let per_window = if window_ns == 0 || elapsed >= 16 * THIN_WINDOW_NS {
            0
        } else {
            let events = if window_events < MAX_RATE {
                window_events
            } else {
                MAX_RATE
            };
            events * THIN_WINDOW_NS / elapsed
        };
        (now_ns, 0, pow2_at_least(per_window / allowance))
    } else {
        (window_ns, window_events, factor)
    };
    let events = events + 1;
    let within = pow2_at_least(events.div_ceil(allowance));
    let factor = if within > base { within } else { base };
    ThinStep {
        window_ns,
        window_events: events,
        factor: if factor < MAX_THIN_FACTOR {
            factor
        } else {
            MAX_THIN_FACTOR
        },
    }
}

/// The largest thinned weight `factor × weight`. Every term of
/// [`SampleDelta::thinned`] is exact up to 2^39, but a sample's variance
/// terms grow as its square: at 2^39 four samples of one stack fill the
/// 2^80 bytes² a variance sum holds. At 4 GiB each term is at most 2^64
/// bytes², as an unthinned sample of a 4 GiB weight.
pub const MAX_THINNED_WEIGHT: u64 = 1 << 32;

/// The factor one alloc event is thinned by, given its process's `factor`
/// (from [`thin_step`]): that factor, lowered for a heavy event to the
/// largest power of two at which `factor × weight` stays within
/// [`MAX_THINNED_WEIGHT`] (1, kept for sure, for a weight beyond it), so
/// that no sample's sums are clamped. Decided from the event itself before
/// its own draw: keeping it 1 in the lower factor and scaling by that stays
/// unbiased. Only events of weight above 2^32 / factor keep more than the
/// budget would (above 4 KiB at the largest factor, 2^20; above 4 MiB at
/// factor 1024): nearly all are allocations of megabytes, whose own cost
/// dwarfs a stack walk. An invalid weight (0, or [`MAX_WEIGHT`] and more:
/// its process's intervals are unavailable, see [`weight_check`]) keeps
/// the process's factor.
#[inline(always)]
pub fn thin_factor_for(factor: u64, weight: u64) -> u64 {
    if factor <= 1 {
        return 1;
    }
    if weight == 0 || weight >= MAX_WEIGHT {
        return factor;
    }
    // The factors that fit are those ≤ `fits` (0: none, not even 1).
    let fits = MAX_THINNED_WEIGHT / weight;
    if factor <= fits {
        factor
    } else if fits == 0 {
        1
    } else {
        // `fits` < factor ≤ 2^20 here: the largest power of two ≤ it.
        pow2_at_least(fits + 1) >> 1
    }
}

/// The smallest power of two ≥ `x` (1 for 0), saturating at 2^32; no loop
/// and no count-leading-zeros (the BPF target has neither).
#[inline(always)]
const fn pow2_at_least(x: u64) -> u64 {
    if x <= 1 {
        return 1;
    }
    if x > 1 << 32 {
        return 1 << 32;
    }
    let mut v = x - 1;
    v |= v >> 1;
    v |= v >> 2;
    v |= v >> 4;
    v |= v >> 8;
    v |= v >> 16;
    v + 1
}

/// A user stack, filed under the hash of its process image and frames
/// (see [`stack_seed`]).
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
    /// The user stack could not be taken.
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
    /// The emitter could not track a sampled allocation (alloc with pointer
    /// 0; allocprof's allocator: the block could not be placed). Its bytes
    /// are in the allocated sums but missing from the live ones.
    Unplaced = 9,
    /// The per-CPU stack scratch was in use by a preempted program on this
    /// CPU: the sample is kept, under an unavailable stack.
    ScratchBusy = 10,
    /// The process created new stacks faster than its budget allows (e.g.
    /// garbage unwinds of code without frame pointers): the sample is kept,
    /// under the process's overflow stack ([`OVERFLOW_STACK`]).
    StackRateLimited = 11,
    /// The unwinder reached code it has no rule for (a file without
    /// call-frame information, or whose table did not fit the kernel's):
    /// the sample is kept, its stack ends in a truncation marker.
    StackTruncated = 12,
    /// The sample came before its process's unwind tables were in (a new
    /// or just exec'ed process): walked by frame pointers, its stack is cut
    /// after the first frame in a file not known to keep them, where the
    /// walk could have gone astray; the sample is kept, its stack ends in a
    /// marker. Counted by user space, which makes that cut.
    StackBeforeTables = 13,
    /// The stack was deeper than [`MAX_STACK_DEPTH`] frames: the sample is
    /// kept, its stack ends in a marker in place of its last frame. Counted
    /// by user space, from the kernel's marker.
    StackTooDeep = 14,
}

pub const DROP_REASONS: usize = 15;

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
        DropReason::Unplaced,
        DropReason::ScratchBusy,
        DropReason::StackRateLimited,
        DropReason::StackTruncated,
        DropReason::StackBeforeTables,
        DropReason::StackTooDeep,
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
            DropReason::Unplaced => "sample the allocator could not track",
            DropReason::ScratchBusy => "stack scratch busy (preempted walk)",
            DropReason::StackRateLimited => {
                "new stacks over the per-process limit (kept under the overflow stack)"
            }
            DropReason::StackTruncated => {
                "stack cut short: code without unwind info (kept, ends in a marker)"
            }
            DropReason::StackBeforeTables => {
                "stack cut short: taken before the process's unwind tables were in (kept, ends in a marker)"
            }
            DropReason::StackTooDeep => {
                "stack deeper than 127 frames (kept, cut there, ends in a marker)"
            }
        }
    }
}

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
    pub stack_budget_ns: u64,
    /// Which probe contracts the process fired alloc probes of: a bit per
    /// provider ([`CONTRACT_OTEL_MEMORY`], [`CONTRACT_DDHEAP`]).
    pub contracts: u64,
    /// The weight form, tracked per process (see [`weight_check`]): the
    /// smallest valid weight seen (0: none yet), and how many weights were
    /// not a multiple of the smallest (at the time), below their size, or
    /// invalid (0, or at least [`MAX_WEIGHT`]).
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

/// What one alloc probe's weight says about the process's weight form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightCheck {
    /// The process's smallest valid weight after this one.
    pub min_weight: u64,
    /// Not a multiple of the smallest weight (or the smallest weight, now
    /// replaced by this one, is not a multiple of it).
    pub not_multiple: bool,
    /// Below the allocation's size: impossible for `size / p`.
    pub below_size: bool,
    /// 0, or so large the sums would be clamped ([`MAX_WEIGHT`]).
    pub invalid: bool,
}

/// One modulo per sample: keeps `min_weight` the smallest valid weight and
/// flags a weight that breaks "every weight is a multiple of the smallest".
/// Checking each new weight against the current minimum in both directions
/// keeps "no flag so far ⇒ every weight seen is a multiple of the minimum",
/// i.e. the gcd of the weights is their minimum: a new larger weight must be
/// a multiple of it, and a new smaller one must divide it (then it divides
/// every earlier weight too). The converse holds once the smallest weight
/// has been seen before any non-multiple of it: for `nsamples × R` weights
/// the minimum is R from the first sample that crossed a single sampling
/// point (nearly every allocation smaller than R, so in practice the first
/// samples), and every weight is a multiple of R, so the flag stays clear.
/// A process whose first samples all crossed several points may be flagged
/// (then its intervals use the `size / p` model, or are unavailable).
#[inline(always)]
pub fn weight_check(min_weight: u64, size: u64, weight: u64) -> WeightCheck {
    if weight == 0 || weight >= MAX_WEIGHT {
        return WeightCheck {
            min_weight,
            not_multiple: false,
            below_size: false,
            invalid: true,
        };
    }
    let (min, not_multiple) = if min_weight == 0 {
        (weight, false)
    } else if weight < min_weight {
        (weight, !min_weight.is_multiple_of(weight))
    } else {
        (min_weight, !weight.is_multiple_of(min_weight))
    };
    WeightCheck {
        min_weight: min,
        not_multiple,
        below_size: weight < size,
        invalid: false,
    }
}

/// How a process's weights estimate bytes, decided from its [`ProcCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightForm {
    /// No alloc probe weighed yet.
    NoSamples,
    /// `size / p` (the inverse inclusion probability, allocprof's allocator):
    /// variance estimate `Σ w·(w − size)`, the kernel's variance sums.
    InverseProbability,
    /// `nsamples × R` (OpenTelemetry's design): every weight a multiple of
    /// the smallest, `interval` (R). Each sample's count of sampling points
    /// is Poisson(size/R), so its variance is R·size, estimated by R·w:
    /// the variance of a sum is R times its bytes.
    PointsTimesInterval { interval: u64 },
    /// Neither: an invalid weight (0, huge), or a weight below its size
    /// that is not a multiple of one R. No honest interval exists.
    Unrecognized,
}

impl ProcCounters {
    /// The weight form of this process's samples (all its images').
    pub fn weight_form(&self) -> WeightForm {
        if self.weights_invalid > 0 {
            WeightForm::Unrecognized
        } else if self.min_weight == 0 {
            WeightForm::NoSamples
        } else if self.weights_not_multiple == 0 {
            // Also true of a process with a single `size / p` sample, or
            // only identical ones: R·w ≥ w·(w − size) there, conservative.
            WeightForm::PointsTimesInterval {
                interval: self.min_weight,
            }
        } else if self.weights_below_size == 0 {
            WeightForm::InverseProbability
        } else {
            WeightForm::Unrecognized
        }
    }
}

/// Process lifecycle event sent to user space through a ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    pub pid: u32,
    pub kind: u32,
}

/// A free the kernel saw no allocation for, in a process whose ledger user
/// space seeded (`SEEDED_PIDS`): perhaps a block allocated before attach,
/// which user space then retires. Sent through its own ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnseenFree {
    pub pid: u32,
    pub _pad: u32,
    pub ptr: u64,
}

pub const PROC_EVENT_EXIT: u32 = 1;
pub const PROC_EVENT_EXEC: u32 = 2;
/// The kernel's OOM killer picked the process (`oom:mark_victim`).
pub const PROC_EVENT_OOM: u32 = 3;

/// Stack id of samples whose user stack could not be taken: they are still
/// accounted, under a stack user space shows as unavailable.
pub const NO_STACK: u64 = 0;

/// Stack id of samples whose process was over its budget of new stacks
/// ([`DropReason::StackRateLimited`]): still accounted, under one stack per
/// process image that user space shows as a stack flood. [`stack_id`] never
/// produces it (nor [`NO_STACK`]).
pub const OVERFLOW_STACK: u64 = u64::MAX;

/// Default budget of new stack-table entries per process: a real program
/// sampled at 512 KiB creates a few thousand distinct stacks, mostly in its
/// first seconds (the burst covers that start-up), then a trickle as new
/// paths run (the rate); garbage unwinds of code without frame pointers
/// create tens of thousands per second, and past the burst need about four
/// minutes at this rate to fill the 65,536-entry table (seconds before),
/// while user space reclaims the stacks of images that are gone.
pub const DEFAULT_NEW_STACKS_PER_SECOND: u64 = 256;
pub const DEFAULT_NEW_STACKS_BURST: u64 = 4096;
/// Bounds that keep `burst × interval` far from wrapping (2^20 × 10^9 < 2^50),
/// as the BPF backend has no overflow-checked multiply.
pub const MAX_NEW_STACKS_BURST: u64 = 1 << 20;

/// A GCRA rate limiter (a token bucket kept as one timestamp): may the
/// process file one more new stack at `now_ns`, given its theoretical
/// arrival time `tat_ns` (0 at first)? Each new stack moves the time by
/// 1/rate; up to `burst` may be ahead of `now`. Returns the new `tat_ns` if
/// allowed. A rate of 0 or over 10^9 per second means unlimited.
#[inline(always)]
pub fn new_stack_budget(tat_ns: u64, now_ns: u64, per_second: u64, burst: u64) -> Option<u64> {
    if per_second == 0 || per_second > 1_000_000_000 {
        return Some(now_ns);
    }
    let interval = 1_000_000_000 / per_second;
    let burst = if burst < MAX_NEW_STACKS_BURST {
        burst
    } else {
        MAX_NEW_STACKS_BURST
    };
    let start = if tat_ns > now_ns { tat_ns } else { now_ns };
    let next = start + interval;
    if next - now_ns <= burst * interval {
        Some(next)
    } else {
        None
    }
}

/// A shared counter of walks claiming a scratch buffer: an atomic add and
/// an atomic read (the kernel side has no compare-and-swap).
pub trait ClaimCounter {
    fn add(&self, v: u64);
    fn load(&self) -> u64;
}

/// Claims a scratch buffer shared by programs that can preempt each other
/// (uprobe programs on one CPU): claim, then look. Only a claimant that sees
/// its own claim alone owns it; two racing claimants may both back off, but
/// never both proceed. Release with [`release_claim`] after a `true`.
#[inline(always)]
pub fn try_claim<C: ClaimCounter>(claims: &C) -> bool {
    claims.add(1);
    if claims.load() == 1 {
        return true;
    }
    claims.add(u64::MAX); // wrapping -1: withdraw our claim
    false
}

#[inline(always)]
pub fn release_claim<C: ClaimCounter>(claims: &C) {
    claims.add(u64::MAX);
}

/// FNV-1a over the frames, seeded by [`stack_seed`] (here, beside the types,
/// so host tests can compute what the kernel does). Two distinct stacks
/// collide with odds about n²/2^65 for n stacks: negligible at the table's
/// 65,536, but then they would merge.
#[inline(always)]
pub fn stack_hash_step(hash: u64, frame: u64) -> u64 {
    (hash ^ frame).wrapping_mul(0x0000_0100_0000_01b3)
}

pub const STACK_HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// The hash state a stack of process image (`pid`, `generation`) starts
/// from: every stack id belongs to one image, so the ids of an image that is
/// gone can be deleted without touching another process's stacks. Each FNV
/// step is a bijection of the state for a given frame, so the same frames of
/// two images always hash apart (before [`stack_id`]'s remap).
#[inline(always)]
pub fn stack_seed(pid: u32, generation: u32) -> u64 {
    stack_hash_step(
        STACK_HASH_SEED,
        (u64::from(pid) << 32) | u64::from(generation),
    )
}

/// A finished hash as a stack id: never [`NO_STACK`] nor [`OVERFLOW_STACK`].
#[inline(always)]
pub fn stack_id(hash: u64) -> u64 {
    if hash == NO_STACK {
        1
    } else if hash == OVERFLOW_STACK {
        OVERFLOW_STACK - 1
    } else {
        hash
    }
}

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
    unsafe impl aya::Pod for ProcCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for ProcEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for UnseenFree {}
    // SAFETY: as above.
    unsafe impl aya::Pod for UsdtSpec {}
    // SAFETY: as above.
    unsafe impl aya::Pod for unwind::UnwindRow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for unwind::UnwindMapping {}
    // SAFETY: as above.
    unsafe impl aya::Pod for unwind::ProcUnwind {}
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
        assert_eq!(size_of::<StackTrace>(), 8 * (1 + MAX_STACK_DEPTH));
        assert_eq!(size_of::<ProcCounters>(), 152 + 8 * DROP_REASONS);
        assert_eq!(size_of::<ProcEvent>(), 8);
        assert_eq!(size_of::<UsdtArg>(), 16);
        assert_eq!(size_of::<UsdtSpec>(), 16 * MAX_USDT_ARGS + 8);
    }

    #[test]
    fn a_thinned_sample_counts_factor_times_with_both_stages_variance() {
        // p = 1/4, then kept 1 in 8: counts 32 objects, w' = 3.2 MB.
        let d = SampleDelta::thinned(100_000, 400_000, 8);
        assert_eq!(d.bytes, 3_200_000);
        assert_eq!(d.objects, 32 * OBJECT_SCALE);
        // w'(w' − size) = 8·w(w − size) + w'(w' − w), the HT variance of
        // the product of the two inclusion probabilities (never understated,
        // rounded up by < 0.1% here).
        let close = |units: u64, exact: f64| {
            let v = variance_in_bytes2(units);
            v >= exact && v <= exact * 1.001
        };
        assert!(close(d.var, 3.2e6 * 3.1e6), "{d:?}");
        assert!(close(d.thin_var, 3.2e6 * 2.8e6), "{d:?}");
        assert_eq!(SampleDelta::thinned(100, 400, 1), SampleDelta::of(100, 400));
        assert_eq!(SampleDelta::thinned(100, 400, 0), SampleDelta::of(100, 400));
        let sample = LiveSample {
            size: 100_000,
            weight: 400_000,
            thin_factor: 8,
            ..LiveSample::default()
        };
        assert_eq!(sample.delta(), d);
    }

    #[test]
    fn a_heavy_event_is_thinned_less_so_its_sample_is_never_clamped() {
        // The case of issue 26: a 4 GiB block at factor 512 counted half.
        let (gib4, factor) = (4u64 << 30, 512);
        let old = SampleDelta::thinned(gib4, gib4, factor);
        assert!(old.bytes < gib4 * factor, "{old:?}: the clamp this avoids");
        assert_eq!(thin_factor_for(factor, gib4), 1);
        assert_eq!(thin_factor_for(factor, gib4 / 8), 8);
        assert_eq!(thin_factor_for(factor, gib4 / 8 + 1), 4);
        let d = SampleDelta::thinned(gib4 / 8, gib4 / 8, 8);
        assert_eq!(d.bytes, gib4);
        assert_eq!(d.objects, 8 * OBJECT_SCALE);
        assert_eq!(
            variance_in_bytes2(d.var),
            gib4 as f64 * (gib4 / 8 * 7) as f64
        );
        assert_eq!(d.thin_var, d.var);
        // Every weight at every factor: a power of two, ≤ the factor, as
        // large as fits, and the delta exact (bytes = factor × weight).
        let weights = [1, 3, 4096, 524_288, 3 << 20, 1 << 31, 1 << 32];
        let heavy = [(1 << 32) + 1, 1 << 39, MAX_WEIGHT - 1];
        for weight in weights.into_iter().chain(heavy) {
            for shift in 0..=20 {
                let factor = 1u64 << shift;
                let f = thin_factor_for(factor, weight);
                assert!(f.is_power_of_two() && f <= factor, "{weight} {factor}: {f}");
                let fits = |f: u64| f * weight <= MAX_THINNED_WEIGHT;
                assert!(f == 1 || fits(f), "{weight} {factor}: {f}");
                assert!(f == factor || !fits(2 * f), "{weight} {factor}: {f}");
                let d = SampleDelta::thinned(weight, weight, f);
                assert_eq!(d.bytes, f * weight, "{weight} {factor}");
                assert_eq!(d.objects, f * OBJECT_SCALE, "{weight} {factor}");
                let exact = (f * weight) as f64 * ((f - 1) * weight) as f64;
                let var = variance_in_bytes2(d.var);
                assert!(var >= exact && var <= exact * 1.001 + 1e10, "{weight} {f}");
                // Room in a variance sum for 2^16 such samples at least.
                assert!(d.var <= 1 << 48, "{weight} {f}: {d:?}");
            }
        }
        // Light events keep the process's factor; no factor, no thinning.
        assert_eq!(thin_factor_for(1 << 12, 524_288), 1 << 12);
        assert_eq!(thin_factor_for(1 << 20, 524_288), 1 << 13);
        assert_eq!(thin_factor_for(0, 1 << 30), 1);
        assert_eq!(thin_factor_for(1, 1 << 30), 1);
        // Invalid weights (flagged as such) keep the back-pressure.
        assert_eq!(thin_factor_for(64, 0), 64);
        assert_eq!(thin_factor_for(8, MAX_WEIGHT), 8);
        assert_eq!(thin_factor_for(8, u64::MAX), 8);
    }

    #[test]
    fn a_factor_lowered_per_event_keeps_the_estimate_unbiased() {
        // Each event of a stream of light and heavy ones is kept 1 in its
        // own factor and counted that many times: the expected sum over
        // the draws is the stream's bytes exactly.
        let stream = [(64u64, 1u64 << 16), (4 << 30, 4 << 30), (1 << 36, 1 << 36)];
        for factor in [2u64, 512, 1 << 20] {
            let mut expected = 0.0;
            let mut truth = 0.0;
            for (size, weight) in stream {
                let f = thin_factor_for(factor, weight);
                expected += SampleDelta::thinned(size, weight, f).bytes as f64 / f as f64;
                truth += weight as f64;
            }
            assert_eq!(expected, truth, "factor {factor}");
        }
    }

    #[test]
    fn back_pressure_holds_a_steady_rate_at_the_budget() {
        // 100k events/s against a budget of 1000/s, for 2 s.
        let (budget, rate) = (1000u64, 100_000u64);
        let mut st = ThinStep {
            window_ns: 0,
            window_events: 0,
            factor: 1,
        };
        let mut kept_share = 0.0;
        let mut kept_second_half = 0.0;
        let n = 2 * rate;
        for i in 0..n {
            let now = 1_000 + i * 1_000_000_000 / rate;
            st = thin_step(st.window_ns, st.window_events, st.factor, now, budget);
            assert!(st.factor.is_power_of_two());
            kept_share += 1.0 / st.factor as f64;
            if i >= n / 2 {
                kept_second_half += 1.0 / st.factor as f64;
            }
        }
        // Steady state: at most the budget (powers of two: ≥ half of it).
        assert!(
            (500.0..=1000.0).contains(&kept_second_half),
            "{kept_second_half}"
        );
        // The first window's ramp costs a logarithmic overshoot only.
        assert!(kept_share <= 2.0 * 1000.0 + 1000.0, "{kept_share}");
        // No budget: all kept.
        assert_eq!(thin_step(0, 0, 1, 5, 0).factor, 1);
        // A pause forgets the old rate.
        let later = st.window_ns + 20 * THIN_WINDOW_NS;
        assert_eq!(
            thin_step(st.window_ns, st.window_events, st.factor, later, budget).factor,
            1
        );
    }

    #[test]
    fn powers_of_two_without_loops() {
        for (x, p) in [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 4),
            (5, 8),
            (1 << 20, 1 << 20),
        ] {
            assert_eq!(pow2_at_least(x), p, "{x}");
        }
        assert_eq!(pow2_at_least(u64::MAX), 1 << 32);
    }

    #[test]
    fn sample_delta_is_the_unbiased_contribution() {
        // Sampled with p = 1/4: counts as 4 objects, 4x the bytes.
        let d = SampleDelta::of(100, 400);
        assert_eq!(d.bytes, 400);
        assert_eq!(d.objects, 4 * OBJECT_SCALE);
        assert_eq!(variance_in_bytes2(d.var), 512.0 * 512.0);
        // A huge allocation is always sampled: no variance.
        assert_eq!(SampleDelta::of(1 << 30, 1 << 30).var, 0);
    }

    #[test]
    fn variance_is_exact_on_unit_multiples_and_never_understated() {
        let d = SampleDelta::of(256, 1024 * 256);
        assert_eq!(
            variance_in_bytes2(d.var),
            (1024.0 * 256.0) * (1023.0 * 256.0)
        );
        for (size, weight) in [(1, 4096), (100, 524_288), (8, 9), (4000, 70_000)] {
            let exact = weight as f64 * (weight - size) as f64;
            let kept = variance_in_bytes2(SampleDelta::of(size, weight).var);
            assert!(
                kept >= exact && kept <= exact * 1.07 + 65536.0,
                "{size} {weight}"
            );
        }
    }

    #[test]
    fn variance_of_a_large_rate_is_not_clamped() {
        // R = 1 GiB: a small block weighs about R; w·(w - size) ≈ 2^60 bytes².
        let r: u64 = 1 << 30;
        let kept = variance_in_bytes2(SampleDelta::of(64, r).var);
        let exact = r as f64 * (r - 64) as f64;
        assert!((kept - exact).abs() / exact < 1e-6, "{kept} vs {exact}");
        // The extreme weight still fits one term in u64 (no wrap).
        let top = SampleDelta::of(1, u64::MAX);
        assert_eq!(top.var, var_factor(MAX_WEIGHT) * var_factor(MAX_WEIGHT - 1));
        assert!(top.var <= 1 << 62);
    }

    #[test]
    fn a_stack_sum_does_not_wrap_where_bytes_squared_did() {
        // 2^27 samples of 100 B at R = 512 KiB: about 2^65 bytes², which
        // wrapped the old u64 sum. In variance units it is far from wrapping.
        let d = SampleDelta::of(100, 524_288);
        let samples: u64 = 1 << 27;
        let sum = d.var.checked_mul(samples).expect("no wrap");
        let exact = 524_288.0 * (524_288.0 - 100.0) * samples as f64;
        assert!((variance_in_bytes2(sum) - exact).abs() / exact < 1e-3);
        assert!(sum < u64::MAX >> 12, "room for 2^12 times more samples");
    }

    #[test]
    fn a_claimed_scratch_has_one_owner_at_a_time() {
        extern crate std;
        use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::{sync::Arc, thread, vec::Vec};

        struct Counter(AtomicU64);
        impl ClaimCounter for Counter {
            fn add(&self, v: u64) {
                self.0.fetch_add(v, Ordering::SeqCst);
            }
            fn load(&self) -> u64 {
                self.0.load(Ordering::SeqCst)
            }
        }
        let claims = Arc::new(Counter(AtomicU64::new(0)));
        let in_use = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (claims, in_use) = (claims.clone(), in_use.clone());
                thread::spawn(move || {
                    let mut owned = 0u32;
                    for _ in 0..100_000 {
                        if try_claim(&*claims) {
                            assert!(!in_use.swap(true, Ordering::SeqCst), "two owners");
                            owned += 1;
                            core::hint::spin_loop();
                            in_use.store(false, Ordering::SeqCst);
                            release_claim(&*claims);
                        }
                    }
                    owned
                })
            })
            .collect();
        let owned: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(owned > 0, "nobody ever owned the scratch");
        assert_eq!(claims.load(), 0, "every claim withdrawn or released");
    }

    fn id_of(pid: u32, generation: u32, frames: &[u64]) -> u64 {
        stack_id(
            frames
                .iter()
                .fold(stack_seed(pid, generation), |h, &f| stack_hash_step(h, f)),
        )
    }

    #[test]
    fn stack_ids_belong_to_one_process_image() {
        let frames = [0x4011_2233, 0x4011_5566, 0x7fff_0000_1234];
        let a = id_of(100, 0, &frames);
        assert_eq!(a, id_of(100, 0, &frames), "deterministic");
        assert_ne!(a, id_of(101, 0, &frames), "another process");
        assert_ne!(a, id_of(100, 1, &frames), "the next image of the process");
        // pid and generation are not interchangeable.
        assert_ne!(id_of(1, 2, &frames), id_of(2, 1, &frames));
        for pid in 0..2000 {
            for generation in 0..4 {
                for depth in 0..frames.len() {
                    let id = id_of(pid, generation, &frames[..depth]);
                    assert!(id != NO_STACK && id != OVERFLOW_STACK);
                }
            }
        }
        // The reserved ids are remapped, never produced.
        assert_eq!(stack_id(NO_STACK), 1);
        assert_eq!(stack_id(OVERFLOW_STACK), OVERFLOW_STACK - 1);
        assert_eq!(stack_id(42), 42);
    }

    #[test]
    fn new_stack_budget_allows_a_burst_then_the_rate() {
        const S: u64 = 1_000_000_000;
        let (rate, burst) = (4, 10);
        let now = 1000 * S;
        let mut tat = 0;
        let mut allowed = 0;
        // 100 new stacks at the same instant: the burst passes.
        for _ in 0..100 {
            if let Some(t) = new_stack_budget(tat, now, rate, burst) {
                tat = t;
                allowed += 1;
            }
        }
        assert_eq!(allowed, burst);
        // One second later, `rate` more.
        let mut later = 0;
        for _ in 0..100 {
            if let Some(t) = new_stack_budget(tat, now + S, rate, burst) {
                tat = t;
                later += 1;
            }
        }
        assert_eq!(later, rate);
        // After a long quiet time the bucket is full again, never fuller.
        let mut refilled = 0;
        for _ in 0..100 {
            if let Some(t) = new_stack_budget(tat, now + 3600 * S, rate, burst) {
                tat = t;
                refilled += 1;
            }
        }
        assert_eq!(refilled, burst);
        // Unlimited rates, and the extreme parameters do not wrap.
        assert_eq!(new_stack_budget(5, 7, 0, 0), Some(7));
        assert_eq!(new_stack_budget(5, 7, u64::MAX, 0), Some(7));
        assert!(new_stack_budget(0, u64::MAX / 2, 1, u64::MAX).is_some());
        assert_eq!(new_stack_budget(0, now, 1, 0), None, "no burst: nothing");
    }

    /// The weights a process fired, folded as the kernel does.
    fn form_of(samples: &[(u64, u64)]) -> WeightForm {
        let mut p = ProcCounters::default();
        for &(size, weight) in samples {
            let c = weight_check(p.min_weight, size, weight);
            p.min_weight = c.min_weight;
            p.weights_not_multiple += u64::from(c.not_multiple);
            p.weights_below_size += u64::from(c.below_size);
            p.weights_invalid += u64::from(c.invalid);
        }
        p.weight_form()
    }

    #[test]
    fn weight_form_is_detected_per_process() {
        const R: u64 = 4096;
        assert_eq!(form_of(&[]), WeightForm::NoSamples);
        // nsamples × R, in any order, sizes above and below R.
        let points = [(100, R), (20_000, 5 * R), (9000, 2 * R), (30, R), (4096, R)];
        assert_eq!(
            form_of(&points),
            WeightForm::PointsTimesInterval { interval: R }
        );
        // The minimum arriving last still divides everything before it.
        assert_eq!(
            form_of(&[(9000, 2 * R), (20_000, 6 * R), (10, R)]),
            WeightForm::PointsTimesInterval { interval: R }
        );
        // size / p: never below size, not multiples of one another.
        let ht = [(100, 4146), (8000, 9354), (64, 4128), (1 << 20, 1 << 20)];
        assert_eq!(form_of(&ht), WeightForm::InverseProbability);
        // Below size and not n·R; or invalid weights: no honest interval.
        assert_eq!(
            form_of(&[(100, 4146), (5000, 4097)]),
            WeightForm::Unrecognized
        );
        assert_eq!(form_of(&[(100, R), (8, 0)]), WeightForm::Unrecognized);
        assert_eq!(
            form_of(&[(100, R), (8, u64::MAX)]),
            WeightForm::Unrecognized
        );
        assert_eq!(form_of(&[(8, MAX_WEIGHT)]), WeightForm::Unrecognized);
    }

    #[test]
    fn weight_check_is_the_gcd_test() {
        // No flag ⇒ gcd(weights) == min(weights), and ⇔ when the minimum
        // came first, over small random sets.
        fn gcd(a: u64, b: u64) -> u64 {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut min = 0;
            let mut flagged = false;
            let (mut g, mut m, mut first) = (0, u64::MAX, 0);
            for _ in 0..1 + x % 5 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let w = 3 * (1 + x % 12);
                let c = weight_check(min, 1, w);
                min = c.min_weight;
                flagged |= c.not_multiple;
                g = gcd(g, w);
                m = m.min(w);
                if first == 0 {
                    first = w;
                }
            }
            assert_eq!(min, m);
            if !flagged {
                assert_eq!(g, m);
            }
            if first == m {
                assert_eq!(!flagged, g == m, "gcd {g} min {m}");
            }
        }
    }

    #[test]
    fn drop_reasons_index_their_own_slot() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
