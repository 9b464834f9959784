//! Back-pressure (`--max-event-rate`): how many of a process's alloc events
//! the kernel keeps, so that the kept ones stay near a rate per process. A
//! kept sample then counts the factor times its weight
//! ([`SampleDelta::thinned`](crate::SampleDelta::thinned)).

use crate::MAX_WEIGHT;

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
/// [`SampleDelta::thinned`](crate::SampleDelta::thinned) is exact up to 2^39, but a sample's variance
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
/// dwarfs a stack walk. An invalid weight (0, or [`MAX_WEIGHT`](crate::MAX_WEIGHT) and more:
/// its process's intervals are unavailable, see [`weight_check`](crate::weight_check)) keeps
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OBJECT_SCALE, SampleDelta, variance_in_bytes2};

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
}
