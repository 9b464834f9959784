//! The flood budget: a per-process rate limit on new stack-table entries,
//! so that garbage unwinds cannot fill the stack table (samples over it go
//! to the process's overflow stack).

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
