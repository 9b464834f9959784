//! The per-process sample budget (`ALLOCPROF_MAX_EVENT_RATE`): thinning in
//! the allocator, before the probe.
//!
//! A sampled allocation costs the process ≈ 2 µs of its own CPU when
//! allocprof is attached, ≈ 0.8 µs of it the two uprobe hits that no eBPF
//! change removes; the kernel's back-pressure (`--max-event-rate`) runs after
//! the probe fired. So the allocator itself keeps 1 sampled allocation in
//! `k` and counts each kept one `k` times, with the kernel's logic
//! (`profiler_common::thin_step`, `thin_factor_for`) on a process-wide
//! window of relaxed atomics. `k` is decided before the allocation's own
//! draw, so the estimate stays unbiased whatever races between threads did
//! to the window (they only make the count approximate), and the
//! inverse-probability variance `w'(w' − size)` the kernel computes per
//! sample stays exact with `w' = k·w` (inclusion probability `p/k`).
//!
//! A dropped sample is an ordinary unsampled allocation: the backend (or a
//! warm slot for a big block), no region slot, no ledger record, no probe.
//! The count of dropped ones and the factor in force are published in the
//! backend statistics block (`backend_stats`), where allocprof reads them.
//!
//! The default budget applies only when `ALLOCPROF_RATE` is not set: an
//! explicit rate is an explicit cost choice (tests and users asking for
//! `ALLOCPROF_RATE=1` get every allocation).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use profiler_common::{MAX_WEIGHT, thin_factor_for, thin_step};

/// Sampled allocations per second and process kept by default. A kept
/// sample (its alloc and its free) cost a 2-thread churn ≈ 5 µs of its CPU
/// attached on the project's shared 2-core machine, so 5k/s is ≈ 2.5% of
/// one core (the factor is a power of two: a steady rate keeps between half
/// the budget and the budget; a burst's first window keeps a few times
/// more). docs/benchmarks.md has the measurement: attached/unattached CPU
/// 1.021 at 5k, 1.036 at 8k, 1.05 at 10k, 1.07 at 16k.
pub const DEFAULT_MAX_EVENT_RATE: u64 = 5_000;

/// A process's thinning window, in relaxed atomics (see the module doc).
pub struct Window {
    window_ns: AtomicU64,
    events: AtomicU64,
    factor: AtomicU64,
}

impl Default for Window {
    fn default() -> Self {
        Self::new()
    }
}

impl Window {
    pub const fn new() -> Self {
        Window {
            window_ns: AtomicU64::new(0),
            events: AtomicU64::new(0),
            factor: AtomicU64::new(1),
        }
    }

    /// The factor for one more sampled allocation at `now_ns` under a
    /// budget of `per_second` (0: none, factor 1).
    pub fn step(&self, now_ns: u64, per_second: u64) -> u64 {
        if per_second == 0 {
            return 1;
        }
        let s = thin_step(
            self.window_ns.load(Relaxed),
            self.events.load(Relaxed),
            self.factor.load(Relaxed),
            now_ns,
            per_second,
        );
        self.window_ns.store(s.window_ns, Relaxed);
        self.events.store(s.window_events, Relaxed);
        self.factor.store(s.factor, Relaxed);
        s.factor
    }

    /// The factor last decided (1: none).
    pub fn factor(&self) -> u64 {
        self.factor.load(Relaxed).max(1)
    }

    /// A fresh window (a fork child's).
    pub fn reset(&self) {
        self.window_ns.store(0, Relaxed);
        self.events.store(0, Relaxed);
        self.factor.store(1, Relaxed);
    }
}

/// One sampled allocation of weight `weight` at the process's factor
/// `factor`, with a uniform 64-bit `draw`: its thinned weight `k·weight`
/// if kept (probability `1/k`, `k = thin_factor_for(factor, weight)`, so
/// `k·weight` stays within `MAX_THINNED_WEIGHT`), `None` if dropped.
pub fn thin(factor: u64, weight: u64, draw: u64) -> Option<u64> {
    // An invalid weight (never ours) is kept as it is.
    if weight == 0 || weight >= MAX_WEIGHT {
        return Some(weight);
    }
    let k = thin_factor_for(factor, weight);
    // High bits: splitmix64's are as good as its low ones, and k ≤ 2^20.
    if k > 1 && (draw >> 32) & (k - 1) != 0 {
        return None;
    }
    Some(weight * k)
}

/// Parses `ALLOCPROF_MAX_EVENT_RATE`: sampled allocations per second,
/// `16000` or `16k` (k = 1000: a count, not bytes), `0` for no budget.
pub fn parse_max_event_rate(s: &[u8]) -> Result<u64, profiler_common::rate::RateError> {
    profiler_common::rate::parse_scaled(s, &[(b'k', 1000)])
}

/// The budget from the two variables' values (`None`: unset): the explicit
/// one, else the default unless `ALLOCPROF_RATE` is set. The flag says the
/// explicit one was malformed (then it counts as unset).
pub fn budget_from(max_event_rate: Option<&[u8]>, rate: Option<&[u8]>) -> (u64, bool) {
    use profiler_common::rate::RateError;
    let (explicit, bad) = match max_event_rate.map(parse_max_event_rate) {
        Some(Ok(v)) => (Some(v), false),
        None | Some(Err(RateError::Empty)) => (None, false),
        Some(Err(_)) => (None, true),
    };
    // `ALLOCPROF_RATE=` (empty) means unset, as for the rate itself.
    let rate_set = rate.is_some_and(|r| !r.trim_ascii().is_empty());
    let budget = match explicit {
        Some(v) => v,
        None if rate_set => 0,
        None => DEFAULT_MAX_EVENT_RATE,
    };
    (budget, bad)
}

const UNREAD: u64 = u64::MAX;
static BUDGET: AtomicU64 = AtomicU64::new(UNREAD);
static WINDOW: Window = Window::new();

/// The process's budget, reading the environment on first use.
fn budget() -> u64 {
    let b = BUDGET.load(Relaxed);
    if b != UNREAD {
        return b;
    }
    let (budget, bad) = crate::env::with_var(c"ALLOCPROF_MAX_EVENT_RATE", |m| {
        crate::env::with_var(c"ALLOCPROF_RATE", |r| budget_from(m, r))
    });
    match BUDGET.compare_exchange(UNREAD, budget, Relaxed, Relaxed) {
        Ok(_) => {
            crate::backend_stats::publish_budget(budget);
            if bad {
                warn_malformed();
            }
            budget
        }
        Err(published) => published,
    }
}

/// After the sampler said "sampled" with weight `weight`: the weight to
/// record (`k·weight`), or 0 if the budget drops this one. `draw` is a
/// fresh uniform 64-bit number of the thread's sampler. Slow path only: no
/// allocation, lock or wait.
pub(crate) fn apply(weight: u64, draw: u64) -> u64 {
    let per_second = budget();
    if per_second == 0 {
        return weight;
    }
    let factor = WINDOW.step(crate::clock::coarse_ns(), per_second);
    crate::backend_stats::publish_factor(factor);
    match thin(factor, weight, draw) {
        Some(w) => w,
        None => {
            crate::backend_stats::count_thinned();
            0
        }
    }
}

/// The process the budget was last made fresh for (0: none yet).
static FRESH_FOR: AtomicU32 = AtomicU32::new(0);

/// In fork child `pid` (from the atfork handler, single-threaded, and from
/// the child's first slow path, which also covers forks that bypass the
/// handler): a fresh window and count, so the child's figures are its own.
/// Once per child: the second call would wipe what threads the child
/// started meanwhile had counted.
pub(crate) fn forget_in_fork_child(pid: u32) {
    if first_for(&FRESH_FOR, pid) {
        WINDOW.reset();
        crate::backend_stats::reset_thinning();
    }
}

/// Whether `pid` is not the one `fresh_for` last held (it holds `pid` now).
fn first_for(fresh_for: &AtomicU32, pid: u32) -> bool {
    fresh_for.swap(pid, Relaxed) != pid
}

fn warn_malformed() {
    const MSG: &[u8] = b"allocprof: malformed ALLOCPROF_MAX_EVENT_RATE (expected sampled allocations per second, e.g. 16000 or 16k; 0 disables); using the default\n";
    // SAFETY: plain write(2) of a static buffer; the result is ignored on
    // purpose (nowhere to report a failed warning).
    unsafe {
        libc::syscall(libc::SYS_write, 2, MSG.as_ptr(), MSG.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::rate::RateError;
    use profiler_common::{MAX_THIN_FACTOR, MAX_THINNED_WEIGHT, THIN_WINDOW_NS};

    #[test]
    fn the_variable_parses_counts_and_refuses_garbage() {
        assert_eq!(parse_max_event_rate(b"16000"), Ok(16_000));
        assert_eq!(parse_max_event_rate(b" 16k\n"), Ok(16_000));
        assert_eq!(parse_max_event_rate(b"2K"), Ok(2_000));
        assert_eq!(parse_max_event_rate(b"0"), Ok(0));
        assert_eq!(parse_max_event_rate(b""), Err(RateError::Empty));
        assert_eq!(parse_max_event_rate(b"k"), Err(RateError::BadDigit));
        assert_eq!(parse_max_event_rate(b"-5"), Err(RateError::BadDigit));
        assert_eq!(parse_max_event_rate(b"16m"), Err(RateError::BadSuffix));
        assert_eq!(parse_max_event_rate(b"1.5k"), Err(RateError::BadSuffix));
        assert_eq!(
            parse_max_event_rate(b"99999999999999999999"),
            Err(RateError::Overflow)
        );
        assert_eq!(
            parse_max_event_rate(b"18446744073709551615k"),
            Err(RateError::Overflow)
        );
        assert_eq!(
            parse_max_event_rate(crate::env::TOO_LONG),
            Err(RateError::BadDigit)
        );
    }

    #[test]
    fn the_default_budget_applies_only_without_an_explicit_rate() {
        let d = DEFAULT_MAX_EVENT_RATE;
        assert_eq!(budget_from(None, None), (d, false));
        assert_eq!(budget_from(None, Some(b"1")), (0, false));
        assert_eq!(budget_from(None, Some(b"")), (d, false));
        assert_eq!(budget_from(Some(b"5k"), Some(b"1")), (5000, false));
        assert_eq!(budget_from(Some(b"0"), None), (0, false));
        assert_eq!(budget_from(Some(b""), None), (d, false));
        // Garbage: warned, then as if unset.
        assert_eq!(budget_from(Some(b"lots"), None), (d, true));
        assert_eq!(budget_from(Some(b"lots"), Some(b"4k")), (0, true));
    }

    #[test]
    fn a_fork_child_s_budget_is_made_fresh_once() {
        let fresh_for = AtomicU32::new(0);
        // The handler, then the child's first slow path: once.
        assert!(first_for(&fresh_for, 4242));
        assert!(!first_for(&fresh_for, 4242));
        // Its own child: once again.
        assert!(first_for(&fresh_for, 4243));
        assert!(!first_for(&fresh_for, 4243));
    }

    /// The window with an injected clock: a steady 200k sampled/s against
    /// 16k/s settles at factor 16 (12.5k/s kept), a burst raises it within
    /// its window, a pause forgets it.
    #[test]
    fn the_window_holds_a_busy_process_near_its_budget() {
        let w = Window::new();
        let (budget, rate) = (16_000u64, 200_000u64);
        let mut kept = 0.0;
        let n = 2 * rate;
        for i in 0..n {
            let now = 1_000 + i * 1_000_000_000 / rate;
            let f = w.step(now, budget);
            assert!(f.is_power_of_two() && f <= MAX_THIN_FACTOR);
            if i >= n / 2 {
                kept += 1.0 / f as f64;
            }
        }
        assert_eq!(w.factor(), 16);
        assert!((8_000.0..=16_000.0).contains(&kept), "{kept} kept in 1 s");
        // A pause of 16 windows and more: a fresh start, factor 1.
        let later = 2 * 1_000_000_000 + 20 * THIN_WINDOW_NS;
        assert_eq!(w.step(later, budget), 1);
        // A burst within one window raises the factor at once.
        let mut f = 1;
        for i in 0..10_000 {
            f = w.step(later + 1 + i, budget);
        }
        assert!(f >= 4, "{f}");
        // No budget: every sample kept, the window untouched.
        assert_eq!(w.step(later + 10_001, 0), 1);
        w.reset();
        assert_eq!(w.factor(), 1);
    }

    #[test]
    fn a_kept_sample_counts_its_factor_and_heavy_ones_are_never_clamped() {
        // Factor 1: every sample kept as it is, whatever the draw.
        assert_eq!(thin(1, 524_800, u64::MAX), Some(524_800));
        // Factor 16: kept iff the draw's 4 bits above bit 32 are 0.
        assert_eq!(thin(16, 524_800, 0), Some(16 * 524_800));
        assert_eq!(thin(16, 524_800, 0xffff_ffff), Some(16 * 524_800));
        assert_eq!(thin(16, 524_800, 1 << 32), None);
        assert_eq!(thin(16, 524_800, 1 << 35), None);
        assert_eq!(thin(16, 524_800, 1 << 36), Some(16 * 524_800));
        // A 1 GiB block at factor 16: thinned only as far as fits.
        let gib = 1u64 << 30;
        assert_eq!(thin(16, gib, 0), Some(MAX_THINNED_WEIGHT));
        assert_eq!(thin(16, 8 * gib, 1 << 32), Some(8 * gib));
        // Weights allocprof flags as invalid pass unchanged.
        assert_eq!(thin(16, 0, 1 << 32), Some(0));
        assert_eq!(thin(16, MAX_WEIGHT, 1 << 32), Some(MAX_WEIGHT));
    }
}
